"""The virtual-time simulator: the real vLLM engine (`server.engine.VirtualEngine`) on a virtual
clock, one engine or a cluster of them behind our routers, driven by a trace's programs.

Why a room of its own: every figure the project publishes comes out of it (`harness bench`,
`harness cluster bench`, `harness plan`), and it stands between the decisions it exercises
(`server/` policies, `cluster/` routers) and the experiments that read its records (`eval/`).
"""
