"""Benchmarks, scoring and metrics: pass rate beside job completion time."""
