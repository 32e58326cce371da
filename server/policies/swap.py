"""`swap`: InferCept's Swap (Abhyankar et al., ICML 2024, section 4.1), on vLLM's KV offloading.

On an interception the program's GPU blocks are freed, so the memory goes to other requests at
once, and its context is kept in host memory instead: when the program resumes, its turn loads
the context back over PCIe rather than recomputing it. Queue order is program-level FCFS, as
in `discard`.

vLLM 0.32 has no "swap request X out now" call; its native KV offloading
(`--kv-offloading-size`, which the engine turns on because `needs_offload` is True) copies
every computed block to host memory as it is written (write-through) and reloads a prefix it
finds there. So swap-out is spread over the turn's steps, overlapped with compute, and freeing
the blocks at the interception (vLLM's default, `on_finish` returning False) is all that is
left to do. Swap-in is the connector's reload, which every resumed turn takes
(`reload_from_cpu` stays True). Two differences from the paper's Swap, both vLLM's: while the
freed blocks are still in the GPU prefix cache (nobody needed the memory yet) the turn uses
them and loads nothing, and a context evicted from the bounded host cache (LRU) is recomputed.
No constants.
"""

from server.policies.program_fcfs import ProgramFCFSPolicy


class SwapPolicy(ProgramFCFSPolicy):
    name = "swap"
    needs_offload = True
