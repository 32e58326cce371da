"""Serving side of harness: vLLM integration, emulated GPU, agent-event intake.

Only `server.scheduler`, `server.emulated.executor` and `server.intake.event_plugin` import vLLM;
everything under `server.policies` is plain Python so the same decisions run on a GPU, on the
emulated GPU and in unit tests.
"""
