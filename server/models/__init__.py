"""Models as an input: the resolver from `--model` to a served folder, the hub as a source,
GGUF conversion; the shipped model configs live beside them as data."""
