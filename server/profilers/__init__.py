"""The profilers: measured step times on a real GPU or the CPU engine, and the per-step log that the step-time model is checked against."""
