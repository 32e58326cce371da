"""Predictors the harness and the serving policies share: how long a tool call will take
(`predictor.durations`: empirical CDFs per command class and tool, pure Python so the same code
runs inside the scheduler), and how long a turn's answer will be and how long its tool call will
take from the request's text (`predictor.lengths`: AugServe's BERT classifier and regressor, with
a numpy TF-IDF baseline; torch only when the neural model is used), and when a program that
is gone between its requests will be back (`predictor.gaps`: gap distributions per gap kind
and session, with heavy tails, conditioned on the time gone, and their calibration).
"""
