"""ChatHarness against a real `harness serve` (vLLM, our scheduler, the emulated GPU).

The emulated GPU answers the text each request asks for (`vllm_xargs.emulate_text`), so a test
can make the server "say" a hermes tool call and check that vLLM's parser and ChatHarness turn
it into `tool_calls`. One server for the module (~40 s to start).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from pydantic import BaseModel

from common.processes import free_port
from harness.langchain import ChatHarness, HarnessCallbackHandler, ModelError
from harness.server_process import ServerProcess

TEXT = "Thought: the tests pass now.\nAction: finish[done]"
ADD_CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
CONTEXT = ("The repository keeps its parser in a single module, and the failing test shows "
           "that nested brackets are closed in the wrong order when a quote appears inside. ")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@pytest.fixture
def llm(server: ServerProcess) -> ChatHarness:
    return ChatHarness(base_url=server.base_url + "/v1", max_tokens=200, timeout=60)


def received(server: ServerProcess) -> int:
    return int(httpx.get(server.base_url + "/v1/agent/events", timeout=5).json()["received"])


def concat(chunks: list[Any]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    return total


@pytest.mark.server
@pytest.mark.slow
def test_round_trip_invoke_and_ainvoke(llm):
    reply = llm.invoke([HumanMessage("Are the tests passing?")], hints={"emulate_text": TEXT})
    assert reply.content == TEXT
    assert reply.response_metadata["finish_reason"] == "stop"
    usage = reply.usage_metadata
    assert usage["input_tokens"] > 5 and usage["output_tokens"] > 5
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert "cache_read" in usage["input_token_details"]

    areply = asyncio.run(llm.ainvoke("Are they?", hints={"emulate_text": "Yes."}))
    assert areply.content == "Yes." and areply.usage_metadata["output_tokens"] >= 1


@pytest.mark.server
@pytest.mark.slow
def test_streaming_chunks_concatenate_to_the_full_text(llm):
    chunks = list(llm.stream("Are the tests passing?", hints={"emulate_text": TEXT}))
    assert len([c for c in chunks if c.content]) > 3  # really streamed
    full = concat(chunks)
    assert full.content == TEXT and full.usage_metadata["output_tokens"] > 5

    async def astream() -> list[Any]:
        chunks = [c async for c in llm.astream("Again?", hints={"emulate_text": TEXT})]
        await llm.aclose()
        return chunks

    achunks = asyncio.run(astream())
    assert "".join(c.content for c in achunks) == TEXT
    assert concat(achunks).usage_metadata["input_tokens"] > 0


@pytest.mark.server
@pytest.mark.slow
def test_tool_call_replayed_through_the_servers_hermes_parser(llm):
    with_tools = llm.bind_tools([add])
    question = [HumanMessage("What is 2 + 3?")]
    reply = with_tools.invoke(question, hints={"emulate_text": ADD_CALL})
    assert [{k: v for k, v in call.items() if k != "id"} for call in reply.tool_calls] == [
        {"name": "add", "args": {"a": 2, "b": 3}, "type": "tool_call"}]
    assert reply.tool_calls[0]["id"] and reply.response_metadata["finish_reason"] == "tool_calls"

    streamed = concat(list(with_tools.stream(question, hints={"emulate_text": ADD_CALL})))
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == [("add", {"a": 2, "b": 3})]

    # the call and its result go back through the chat template; the model answers
    result = add.invoke(reply.tool_calls[0])
    assert isinstance(result, ToolMessage) and result.content == "5"
    final = with_tools.invoke([*question, reply, result], hints={"emulate_text": "It is 5."})
    assert final.content == "It is 5." and final.tool_calls == []


@pytest.mark.server
@pytest.mark.slow
def test_structured_output_through_a_tool_call(llm):
    class Sum(BaseModel):
        """Two integers to add."""

        a: int
        b: int

    text = '<tool_call>{"name": "Sum", "arguments": {"a": 2, "b": 3}}</tool_call>'
    replaying = llm.model_copy(update={"hints": {"emulate_text": text}})
    assert replaying.with_structured_output(Sum).invoke("2 + 3 as a Sum") == Sum(a=2, b=3)
    raw = replaying.with_structured_output(Sum.model_json_schema(), include_raw=True)
    out = raw.invoke("2 + 3 as a Sum")
    assert out["parsed"] == {"a": 2, "b": 3} and out["raw"].tool_calls[0]["name"] == "Sum"


@pytest.mark.server
@pytest.mark.slow
def test_session_id_cache_and_events_reach_the_server(server):
    sent: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content))

    llm = ChatHarness(base_url=server.base_url, max_tokens=50, timeout=60,
                      http_client=httpx.Client(timeout=60, event_hooks={"request": [record]}))
    handler = llm.callback_handler()
    llm.events.flush()
    before, sent_before = received(server), llm.events.sent
    messages = [SystemMessage("You are a careful software engineer."),
                HumanMessage(CONTEXT * 12 + " What is 2 + 3?")]
    with llm.program() as pid:
        first = llm.bind_tools([add]).invoke(messages, hints={"emulate_text": ADD_CALL},
                                             config={"callbacks": [handler]})
        result = add.invoke(first.tool_calls[0], config={"callbacks": [handler]})
        second = llm.bind_tools([add]).invoke([*messages, first, result],
                                              hints={"emulate_text": "5"},
                                              config={"callbacks": [handler]})
    assert llm.events.flush(timeout_s=10)
    assert [b["session_id"] for b in sent] == [pid, pid]
    assert received(server) - before == 4  # program_start, tool_start, tool_end, program_end
    assert llm.events.sent - sent_before == 4
    # the second turn found the first turn's context in the KV cache (the program's pin)
    assert second.usage_metadata["input_token_details"]["cache_read"] >= \
        first.usage_metadata["input_tokens"] // 16 * 16 - 16

    # explicit program ids: a bound copy, and a per-call keyword
    llm.with_program("explicit-1").invoke("hi", hints={"emulate_text": "hello"})
    llm.invoke("hi", program_id="explicit-2", hints={"emulate_text": "hello"})
    assert [b["session_id"] for b in sent[-2:]] == ["explicit-1", "explicit-2"]

    # a handler that opens a program per top-level chain, in an async run
    opener = HarnessCallbackHandler(server.base_url, open_programs=True)
    chain = RunnableLambda(lambda q: llm.bind_tools([add]).invoke(
        q, hints={"emulate_text": ADD_CALL})) | RunnableLambda(
        lambda reply: add.invoke(reply.tool_calls[0]))
    before = received(server)
    assert asyncio.run(chain.ainvoke("2 + 3?", config={"callbacks": [opener]})).content == "5"
    assert opener.events is llm.events  # one shared client per server
    assert llm.events.flush(timeout_s=10)
    assert received(server) - before == 4 and llm.events.dropped == 0
    assert sent[-1]["session_id"].startswith("lc-")


def test_server_down_is_a_clear_error_not_a_hang():
    down = ChatHarness(base_url=f"http://127.0.0.1:{free_port()}", max_retries=1,
                       backoff_s=0.05, timeout=2)
    started = time.monotonic()
    with pytest.raises(ModelError, match="unreachable"):
        down.invoke("hi")
    with pytest.raises(ModelError, match="unreachable"):
        asyncio.run(down.ainvoke("hi"))
    with pytest.raises(ModelError, match="unreachable"):
        list(down.stream("hi"))
    assert time.monotonic() - started < 10

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = ChatHarness(base_url=f"http://127.0.0.1:{silent.getsockname()[1]}",
                           max_retries=0, timeout=1)
        started = time.monotonic()
        with pytest.raises(ModelError, match="Timeout"):
            mute.invoke("hi")
        assert time.monotonic() - started < 5
