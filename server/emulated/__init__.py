"""The emulated GPU: a vLLM executor that stands in for the GPU, and the worker sides of vLLM's KV offloading and NIXL connectors it plays."""
