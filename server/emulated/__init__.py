"""The emulated GPU: a vLLM executor that stands in for the GPU, and the worker sides of vLLM's
KV offloading, disk tier and NIXL connectors that it plays."""
