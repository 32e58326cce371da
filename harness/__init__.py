"""harness: run tool-using LLM agents fast, on a serving engine that knows they are agents."""

__version__ = "0.1.0"
