"""ChatHarness without a server: LangChain's standard unit tests, and the request bodies and
replies through an in-process httpx transport (what the server would be sent and answer)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_tests.unit_tests import ChatModelUnitTests

from common.processes import free_port
from harness.events_client import BackgroundEventClient, EventClient
from harness.langchain import ChatHarness, HarnessCallbackHandler, ModelError, current_program


class TestChatHarnessStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatHarness]:
        return ChatHarness

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"model": "llama-3.1-8b", "base_url": "http://127.0.0.1:8000/v1"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return ({"HARNESS_API_KEY": "secret", "HARNESS_BASE_URL": "http://10.0.0.1:9000"},
                {"model": "llama-3.1-8b"},
                {"api_key": "secret", "base_url": "http://10.0.0.1:9000"})

    @property
    def supported_usage_metadata_details(self) -> dict[str, list[str]]:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


REPLY = {"id": "chatcmpl-1", "model": "llama-3.1-8b",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": None,
             "tool_calls": [{"id": "call-1", "type": "function",
                             "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
                            {"id": "call-2", "type": "function",
                             "function": {"name": "add", "arguments": "{not json"}}]}}],
         "usage": {"prompt_tokens": 151, "completion_tokens": 24, "total_tokens": 175,
                   "prompt_tokens_details": {"cached_tokens": 144}}}

STREAM = [
    {"id": "c2", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                  "content": "Let me "}}]},
    {"id": "c2", "model": "m", "choices": [{"index": 0, "delta": {"content": "add."}}]},
    {"id": "c2", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call-9", "type": "function",
         "function": {"name": "add", "arguments": '{"a": 2'}}]}}]},
    {"id": "c2", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": ', "b": 3}'}}]}}]},
    {"id": "c2", "model": "m", "choices": [{"index": 0, "delta": {},
                                            "finish_reason": "tool_calls"}]},
    {"id": "c2", "model": "m", "choices": [],
     "usage": {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
               "prompt_tokens_details": {"cached_tokens": 4}}},
]


class Recorder:
    """An httpx transport standing in for the server: records bodies, answers canned data."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.urls: list[str] = []
        self.statuses = statuses or []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        self.headers.append(request.headers)
        self.urls.append(str(request.url))
        if self.statuses:
            status = self.statuses.pop(0)
            if status != 200:
                return httpx.Response(status, json={"error": f"status {status}"})
        if body.get("stream"):
            text = "".join(f"data: {json.dumps(c)}\n\n" for c in STREAM) + "data: [DONE]\n\n"
            return httpx.Response(200, content=text.encode(),
                                  headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json=REPLY)


def model(recorder: Recorder, **params: Any) -> ChatHarness:
    transport = httpx.MockTransport(recorder)
    return ChatHarness(base_url="http://server:8000/v1/", model="llama-3.1-8b",
                       api_key="k", backoff_s=0.0,
                       http_client=httpx.Client(transport=transport),
                       http_async_client=httpx.AsyncClient(transport=transport), **params)


def test_body_carries_program_hints_tools_and_standard_params():
    recorder = Recorder()
    llm = model(recorder, temperature=0.0, max_tokens=64, stop=["Observation:"],
                hints={"turn": 0, "tool": "bash"}, program_id="prog-1")
    reply = llm.bind_tools([add], tool_choice="any").invoke(
        [HumanMessage("add 2 and 3")], hints={"turn": 1, "emulate_text": "x", "tool": None})
    body = recorder.bodies[0]
    assert recorder.urls == ["http://server:8000/v1/chat/completions"]
    assert recorder.headers[0]["authorization"] == "Bearer k"
    assert body["model"] == "llama-3.1-8b" and body["session_id"] == "prog-1"
    assert body["vllm_xargs"] == {"turn": 1, "emulate_text": "x"}  # merged, None dropped
    assert body["temperature"] == 0.0 and body["max_tokens"] == 64
    assert body["stop"] == ["Observation:"] and "stream" not in body
    assert body["tool_choice"] == "required"
    assert body["tools"][0]["function"]["name"] == "add"
    assert body["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
    assert body["messages"] == [{"role": "user", "content": "add 2 and 3"}]

    assert reply.tool_calls == [{"name": "add", "args": {"a": 2, "b": 3}, "id": "call-1",
                                 "type": "tool_call"}]
    assert [c["id"] for c in reply.invalid_tool_calls] == ["call-2"]
    assert reply.usage_metadata == {"input_tokens": 151, "output_tokens": 24,
                                    "total_tokens": 175,
                                    "input_token_details": {"cache_read": 144}}
    assert reply.response_metadata["finish_reason"] == "tool_calls"


def test_per_call_overrides_and_history_with_tool_calls():
    recorder = Recorder()
    llm = model(recorder, program_id="prog-1")
    history = [HumanMessage("add"),
               AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 3},
                                          "id": "call-1"}]),
               ToolMessage("5", tool_call_id="call-1")]
    llm.with_program("prog-2").bind_tools([add], tool_choice="add").invoke(
        history, stop=["END"], model="other-model")
    llm.invoke(history, program_id="prog-3")
    first, second = recorder.bodies
    assert first["session_id"] == "prog-2" and first["model"] == "other-model"
    assert first["stop"] == ["END"] and "temperature" not in first and "vllm_xargs" not in first
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert first["messages"][1]["tool_calls"][0]["function"] == {
        "name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert first["messages"][2] == {"role": "tool", "tool_call_id": "call-1", "content": "5"}
    assert second["session_id"] == "prog-3" and "tools" not in second


def test_stream_chunks_add_up_to_text_tool_call_and_usage():
    recorder = Recorder()
    llm = model(recorder, program_id="p")
    chunks = list(llm.stream("add 2 and 3"))
    assert recorder.bodies[0]["stream"] is True
    assert recorder.bodies[0]["stream_options"] == {"include_usage": True}
    assert any(c.tool_call_chunks for c in chunks)
    full = chunks[0]
    for chunk in chunks[1:]:
        full += chunk
    assert full.content == "Let me add."
    assert full.tool_calls == [{"name": "add", "args": {"a": 2, "b": 3}, "id": "call-9",
                                "type": "tool_call"}]
    assert full.usage_metadata == {"input_tokens": 10, "output_tokens": 7, "total_tokens": 17,
                                   "input_token_details": {"cache_read": 4}}
    assert full.response_metadata["finish_reason"] == "tool_calls"

    async def astream() -> Any:
        parts = [c async for c in llm.astream("add 2 and 3")]
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total

    assert asyncio.run(astream()).tool_calls == full.tool_calls
    streamed = model(Recorder(), streaming=True).invoke("add")  # invoke goes through SSE
    assert streamed.content == "Let me add." and streamed.tool_calls == full.tool_calls


def test_errors_4xx_at_once_5xx_retried_then_clear():
    rejected = Recorder(statuses=[400])
    with pytest.raises(ModelError, match="rejected \\(400\\)"):
        model(rejected, max_retries=3).invoke("hi")
    assert len(rejected.bodies) == 1

    flaky = Recorder(statuses=[503, 502])
    assert model(flaky, max_retries=2).invoke("hi").tool_calls  # third try answers
    assert len(flaky.bodies) == 3

    broken = Recorder(statuses=[500, 500, 500])
    with pytest.raises(ModelError, match="server error 500"):
        asyncio.run(model(broken, max_retries=2).ainvoke("hi"))
    assert len(broken.bodies) == 3


def test_with_structured_output_parses_the_tool_call():
    from pydantic import BaseModel

    class Sum(BaseModel):
        """The sum of two integers."""

        a: int
        b: int

    reply = json.loads(json.dumps(REPLY))
    reply["choices"][0]["message"]["tool_calls"] = [{
        "id": "c", "type": "function",
        "function": {"name": "Sum", "arguments": '{"a": 1, "b": 2}'}}]
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=reply)

    llm = ChatHarness(http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    assert llm.with_structured_output(Sum).invoke("1 + 2") == Sum(a=1, b=2)
    assert bodies[0]["tool_choice"] == "required"
    assert bodies[0]["tools"][0]["function"]["name"] == "Sum"


class Sink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, type: str, program_id: str, **fields: Any) -> None:
        self.events.append({"type": type, "program_id": program_id, **fields})


def test_handler_turns_tool_runs_into_events_and_programs_into_session_ids():
    from langchain_core.runnables import RunnableLambda

    recorder, sink = Recorder(), Sink()
    llm = model(recorder)
    handler = HarnessCallbackHandler(sink)
    with llm.program(events=sink) as pid:
        assert current_program() == pid
        llm.invoke("hi", config={"callbacks": [handler]})
        add.invoke({"a": 2, "b": 3}, config={"callbacks": [handler]})
        with pytest.raises(Exception, match="boom"):
            boom.invoke({"x": "y"}, config={"callbacks": [handler]})
    assert current_program() is None
    assert recorder.bodies[0]["session_id"] == pid
    types = [e["type"] for e in sink.events]
    assert types == ["program_start", "tool_start", "tool_end", "tool_start", "tool_end",
                     "program_end"]
    assert {e["program_id"] for e in sink.events} == {pid}
    start, end = sink.events[1], sink.events[2]
    assert start["tool"] == "add" and start["predicted_s"] is None  # no samples yet
    assert start["gap_kind"] == "tool" and set(start["predicted_q"]) == {"p50", "p90", "p99"}
    assert end["seconds"] >= 0 and end["return_tokens"] == 1
    assert handler.durations.count("add") == 1 and handler.gaps.count("tool") == 2
    add.invoke({"a": 1, "b": 1}, config={"callbacks": [handler]})  # outside any program
    assert len(sink.events) == 6

    # a handler that opens a program per top-level chain; the model inside finds it
    opener = HarnessCallbackHandler(sink, open_programs=True)
    chain = RunnableLambda(lambda q: llm.invoke(q)) | RunnableLambda(
        lambda _: add.invoke({"a": 1, "b": 2}))
    assert chain.invoke("q", config={"callbacks": [opener]}) == 3
    opened = sink.events[6:]
    assert [e["type"] for e in opened] == ["program_start", "tool_start", "tool_end",
                                          "program_end"]
    assert opened[1]["predicted_s"] is None  # the new handler's own durations
    assert len({e["program_id"] for e in opened}) == 1
    assert recorder.bodies[-1]["session_id"] == opened[0]["program_id"]


@tool
def boom(x: str) -> str:
    """Always fails."""
    raise RuntimeError("boom")


def test_background_event_client_emits_from_any_thread_and_counts_drops():
    events = BackgroundEventClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5)
    threads = [threading.Thread(target=lambda i=i: [events.emit("tool_start", f"p{i}")
                                                    for _ in range(10)]) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert events.flush(timeout_s=5)
    events.close()
    assert events.sent == 0 and events.dropped == 40  # no server: dropped, counted
    events.emit("tool_end", "p")  # after close: counted, not raised
    assert events.dropped == 41


def test_event_client_emit_is_thread_safe_inside_a_running_loop():
    async def scenario() -> EventClient:
        async with EventClient(f"http://127.0.0.1:{free_port()}", timeout_s=0.5) as events:
            await asyncio.to_thread(lambda: [events.emit("tool_start", "p") for _ in range(5)])
            events.emit("tool_end", "p")
        return events

    events = asyncio.run(scenario())
    assert events.sent == 0 and events.dropped == 6
