"""What comes in beside vLLM's own API: the agent events (their wire schema, the endpoint plugin
on the API server, the side channel to the scheduler), whose program an event is about, and the
ecosystem's nested request hints."""
