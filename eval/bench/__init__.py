"""`harness bench`: compare policies on a trace, in virtual time, over a sweep of loads.

For every policy and load (jobs/s) the trace's programs are replayed through one fresh
in-process engine (`sim.replay`), and the metrics of `common.metrics.replay_metrics` are
computed against each program's isolated JCT (alone on a `vllm`-policy engine, once per trace
contents and profile, cached in the output folder). Writes ``summary.json`` (``results``: one
row per policy and load), ``report.md``, ``jct_vs_load.png`` (mean and P95 JCT against load),
``jct_cdf.png`` (JCT CDF per policy at the highest load) and ``runs/<policy>-jps<x>.json``
(per-program and per-turn records). Same trace, seed and profile: identical results, apart from
the CPU-time figures (``common.metrics.MACHINE_DEPENDENT``).

One module per job, so each can be read (and changed) alone: `specs` (what a run compares and
the checks of the engine every policy shares, a `server.engine_spec.EngineSpec`), `runs` (the
sweep as a value: workload, policies, runs), `traces` (the programs to replay), `isolated` (the
lower bound, cached), `backends` (the protocol every back end answers: one replay of a policy
at a load, the isolated JCTs), `virtual` (one in-process engine, a virtual-time cluster) and
`served` (HTTP), `parallel` (this process or worker processes), `rows` (a replay's row and
records), `sweep` (the one loop, `sweep.bench`), `summary` (what it returns and writes),
`report` (markdown and the terminal table), `plots`, and `capacity` (sessions per GPU at a
P95 TTFT bound: a search over closed-loop runs, `--capacity`).
The command line is `cli.bench`.
"""
