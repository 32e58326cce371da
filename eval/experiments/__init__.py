"""`harness eval NAME`: the experiments that print figures, one module each (the command line
is `cli.experiments`).

Validity: `fidelity` (the emulated GPU against the CPU engine), `real_model` and `agreement`
(a real model's runs turn by turn), `served_vs_virtual` (a served cluster's ranking against
virtual time), `step_interference`, `perf_table`. Overheads: `sched_overhead`,
`event_overhead`, `bash_overhead`, `router_overhead`. Baselines: `router_baseline`
(`vllm-router` in front of two replicas), `served_comparison` (its program scheduling against
our router and policies). Load: `load_bench` (agent programs against one server).
"""
