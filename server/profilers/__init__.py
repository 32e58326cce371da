"""The profilers: measured step times on a real GPU or the CPU engine, written as the tables
the step-time model is fitted to."""
