"""`discard`: InferCept's improved discard (Abhyankar et al., ICML 2024, section 4.1).

On an interception the program's KV cache is freed (kept only as evictable prefix cache, like
vLLM), but when the program resumes its new turn keeps the program's original arrival time in
the queue (program-level FCFS) instead of queueing behind everything that arrived during the
tool call. No constants.
"""

from server.policies.program_fcfs import ProgramFCFSPolicy


class DiscardPolicy(ProgramFCFSPolicy):
    name = "discard"
