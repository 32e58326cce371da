"""`vllm`: the stock engine, the baseline every other policy is compared to.

A finished turn's KV cache is freed at once (it stays only as evictable prefix cache) and the
waiting queue is vLLM's own request-level FCFS, so the scheduler changes nothing.
"""

from server.policies.base import Policy


class VllmPolicy(Policy):
    name = "vllm"
    reorders_queue = False
