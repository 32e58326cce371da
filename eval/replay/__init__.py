"""Replaying a trace against served engines over HTTP, in wall-clock time.

`http_replay` drives a trace's programs through an OpenAI-compatible server (the agent's model
and event clients, the same hints as the virtual-time replay) and reads its counters;
`program_scheduling` configures and calibrates `vllm-router`'s program scheduling and reads its
metrics. `harness bench --url` and the experiments that put routers in front of replicas
(`eval.experiments`) stand on them.
"""
