"""The virtual-time simulator: the real vLLM engine (`server.engine.VirtualEngine`) on a virtual
clock, one engine or a cluster of them behind our routers, driven by a trace's programs.

Why a room of its own: every figure the project publishes comes out of it (`harness bench`,
`harness cluster bench`, `harness plan`), and it stands between the decisions it exercises
(`server/` policies, `cluster/` routers) and the experiments that read its records (`eval/`).

The room, in reading order:

* `sim.loop`: the discrete-event loop (`replay_cluster` builds and runs a `Simulation`).
* `sim.agenda`: what the loop does between engine steps (a turn is due, a request reaches its
  engine, a finished remote prefill is handed to its decode replica), in time order.
* `sim.virtual_cluster`: the replicas as engines on their own clocks, and the router's view.
* `sim.conversation`: each program's prompts as token ids; `sim.client`: the hints the
  replayed client sends; `sim.records`: what a replay records.
* `sim.replay`: one engine's replay and the isolated-JCT bound; `sim.engines`: every engine
  built one way; `sim.planning`: the planner's simulations.
"""
