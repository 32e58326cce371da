"""Examples run from the command line (`harness eval langchain-example`): `langchain_agent`,
a small tool-using agent written with langchain-core against `harness serve`."""
