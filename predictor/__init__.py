"""Predictors the harness and the serving policies share: how long a tool call will take
(`predictor.durations`), and later how long a turn's output will be.

Pure Python on purpose (no vLLM, no torch): the same estimators run inside the scheduler, in the
client that sends hints, in the virtual-time benchmark and in unit tests.
"""
