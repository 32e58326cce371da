"""Tools the agents call (one module per tool) and the sandbox image they run in."""
