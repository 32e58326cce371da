"""A small tool-using agent written with langchain-core alone, against `harness serve`.

    harness eval langchain-example                 # starts an emulated server
    harness eval langchain-example --server http://127.0.0.1:8000
    harness eval langchain-example --server URL --model NAME --free   # a real model

The agent is a plain loop over `bind_tools`: ask the model, run the tool calls it makes, give
it the results, until it answers without a tool call. The emulated GPU has no model behind it,
so by default each turn asks the server to say a recorded reply (`hints={"emulate_text": ...}`):
vLLM's hermes parser still turns the `<tool_call>` text into OpenAI `tool_calls`, and the
server still schedules, caches and receives the program's events as it would for a real model.
`--free` drops the recorded replies (for a real model).
"""

from __future__ import annotations

import httpx
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool

from harness.langchain import ChatHarness
from harness.model_client import api_root
from harness.server_process import ServerProcess, model_server


@tool
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


TOOLS = {t.name: t for t in (add, multiply)}
QUESTION = "A crate holds 2 red and 3 blue boxes; each box holds 4 tins. How many tins?"
RECORDED = [  # what the emulated model says, turn by turn
    '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
    '<tool_call>{"name": "multiply", "arguments": {"a": 5, "b": 4}}</tool_call>',
    "The crate holds 20 tins.",
]


def run_agent(llm: ChatHarness, replay: list[str] | None, max_turns: int = 8) -> str:
    model = llm.bind_tools(list(TOOLS.values()))
    handler = llm.callback_handler()  # tool_start / tool_end events to the server
    messages: list[BaseMessage] = [
        SystemMessage("Answer with the tools; say the final answer in one sentence."),
        HumanMessage(QUESTION)]
    with llm.program() as program_id:  # program_start ... program_end; calls carry the id
        print(f"program {program_id}")
        for turn in range(max_turns):
            hints = {"turn": turn}
            if replay is not None:
                hints["emulate_text"] = replay[turn]
            reply = model.invoke(messages, hints=hints)
            usage = reply.usage_metadata or {}
            print(f"turn {turn}: {usage.get('input_tokens')} prompt tokens "
                  f"({usage.get('input_token_details', {}).get('cache_read')} from the KV cache)"
                  f", {usage.get('output_tokens')} out")
            messages.append(reply)
            if not reply.tool_calls:
                return str(reply.content)
            for call in reply.tool_calls:
                result = TOOLS[call["name"]].invoke(call, config={"callbacks": [handler]})
                print(f"  {call['name']}({call['args']}) -> {result.content}")
                messages.append(result)
    return "(no answer)"


def run_example(server: str | None = None, model: str = "llama-3.1-8b",
                free: bool = False, device: str | None = None) -> None:
    """The agent against `server` (a base URL), or a `harness serve --policy continuum` started
    for it when None (on `device` with `model`, e.g. cpu and smollm2-135m-instruct, when
    given); `free`: no recorded replies (a real model answers)."""

    def run(base_url: str) -> None:
        llm = ChatHarness(base_url=base_url, model=model, temperature=0, max_tokens=256)
        counter = api_root(base_url) + "/v1/agent/events"
        before = httpx.get(counter, timeout=5).json().get("received")
        answer = run_agent(llm, None if free else RECORDED)
        llm.events.flush()
        after = httpx.get(counter, timeout=5).json().get("received")
        print(f"answer: {answer}")
        print(f"events: {llm.events.sent} sent, {llm.events.dropped} dropped; "
              f"the server received {after - before}")

    if server:
        run(server)
    elif device:
        with model_server(model, device=device, policy="continuum") as process:
            model = process.served_model or model
            run(process.base_url)
    else:
        with ServerProcess(policy="continuum") as process:
            run(process.base_url)
