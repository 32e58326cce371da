"""A LangChain chat model that carries programs, tool calls and hints to the server.

`ChatHarness` talks to `harness serve` (or any OpenAI-compatible endpoint) over httpx, with the
program id as vLLM's `session_id` and the hints as `vllm_xargs`, as `harness run` does:

    llm = ChatHarness(base_url="http://127.0.0.1:8000", model="llama-3.1-8b")
    handler = llm.callback_handler()               # tool_start / tool_end events
    with llm.program() as pid:                     # program_start ... program_end
        reply = llm.bind_tools([add]).invoke(messages)
        result = add.invoke(reply.tool_calls[0], config={"callbacks": [handler]})

A call's program id is, first to last: the `program_id` keyword of the call, the model's own
(`ChatHarness(program_id=...)`, `.with_program(id)`), the one a `HarnessCallbackHandler` in the
call's callbacks gave the run (`open_programs=True` opens one per top-level chain), and the
innermost `program()` block. Events go through the harness's non-blocking `EventClient`
(run on a background loop here, so synchronous code can use it); they are dropped and counted,
never waited for, when the server is slow or gone.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar, Token
from typing import Any, Literal
from uuid import UUID

import httpx
from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    BaseCallbackHandler,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.output_parsers.openai_tools import make_invalid_tool_call, parse_tool_call
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils import from_env, secret_from_env
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field, PrivateAttr, SecretStr, field_validator

from harness.agent import tool_ended, tool_started
from harness.events_client import BackgroundEventClient, EventSink
from harness.model_client import (
    ModelError,
    aiter_sse,
    api_root,
    aretrying,
    chat_body,
    iter_sse,
    retrying,
    session_headers,
    status_error,
    unreachable,
    usage_counts,
)
from predictor.durations import ToolDurationModel
from predictor.gaps import GapModel
from server.models.store import served_name

__all__ = ["ChatHarness", "HarnessCallbackHandler", "ModelError", "ProgramScope",
           "current_program", "new_program_id", "shared_events"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_MODEL = "llama-3.1-8b"

# -- programs ---------------------------------------------------------------------------------

_CURRENT_PROGRAM: ContextVar[str | None] = ContextVar("harness_program_id", default=None)


def current_program() -> str | None:
    """The program id of the innermost `program()` block, if any."""
    return _CURRENT_PROGRAM.get()


def new_program_id(prefix: str = "lc") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


_shared: dict[tuple[str, str], BackgroundEventClient] = {}
_shared_lock = threading.Lock()


def shared_events(base_url: str, api_key: str | None = None) -> BackgroundEventClient:
    """One background event client per server (and key), shared by every model and handler of
    this process and flushed at exit."""
    root = api_root(base_url)
    key = (root, api_key or "")
    with _shared_lock:
        client = _shared.get(key)
        if client is None or client.closed:
            client = _shared[key] = BackgroundEventClient(root, api_key=api_key)
        return client


@atexit.register
def _close_shared() -> None:
    with _shared_lock:
        clients = list(_shared.values())
        _shared.clear()
    for client in clients:
        client.close(flush_timeout_s=1.0)


class ProgramScope:
    """`with` / `async with` block that is one agent program: it picks (or takes) a program id,
    emits `program_start` and `program_end`, and makes the id the current one inside."""

    def __init__(self, events: EventSink, program_id: str | None = None) -> None:
        self.events = events
        self.program_id = program_id or new_program_id()
        self._token: Token[str | None] | None = None

    def __enter__(self) -> str:
        self._token = _CURRENT_PROGRAM.set(self.program_id)
        self.events.emit("program_start", self.program_id)
        return self.program_id

    def __exit__(self, *exc: object) -> None:
        self.events.emit("program_end", self.program_id)
        if self._token is not None:
            _CURRENT_PROGRAM.reset(self._token)
            self._token = None

    async def __aenter__(self) -> str:
        return self.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        self.__exit__(*exc)


# -- interceptions ----------------------------------------------------------------------------


class HarnessCallbackHandler(BaseCallbackHandler):
    """Turns LangChain tool runs into `tool_start` / `tool_end` events (and, with
    `open_programs=True`, each top-level chain run into a program).

    `events` is an `EventClient`, a `BackgroundEventClient`, or a server URL (its shared
    background client). A run's program is its parent run's, else `program_id`, else the
    current `program()` block's; tool runs with no program send nothing. A synchronous handler
    that runs inline, so it also serves async runs without a thread hop: `emit` never blocks.
    `durations` and `gaps` (the gap model whose quantiles `tool_start` carries) are the
    handler's own unless given.
    """

    run_inline = True

    def __init__(self, events: EventSink | str, *, program_id: str | None = None,
                 durations: ToolDurationModel | None = None,
                 gaps: GapModel | None = None, open_programs: bool = False) -> None:
        self.events: EventSink = shared_events(events) if isinstance(events, str) else events
        self.program_id = program_id
        self.durations = durations if durations is not None else ToolDurationModel()
        self.gaps = gaps if gaps is not None else GapModel()
        self.open_programs = open_programs
        self._runs: dict[UUID, str] = {}  # run -> program
        self._opened: dict[UUID, str] = {}  # top-level chain runs that opened a program
        self._tools: dict[UUID, tuple[str, str, float]] = {}  # run -> (program, tool, t0)

    def program_for(self, run_id: UUID) -> str | None:
        """The program of a run this handler has seen start (None when it has none)."""
        return self._runs.get(run_id)

    def _inherit(self, run_id: UUID, parent_run_id: UUID | None) -> str | None:
        program = (self._runs.get(parent_run_id) if parent_run_id is not None else None) \
            or self.program_id or current_program()
        if program is not None:
            self._runs[run_id] = program
        return program

    # chains: programs
    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if self._inherit(run_id, parent_run_id) is None and parent_run_id is None \
                and self.open_programs:
            program = self._runs[run_id] = self._opened[run_id] = new_program_id()
            self.events.emit("program_start", program)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_run(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._end_run(run_id)

    def _end_run(self, run_id: UUID) -> None:
        self._runs.pop(run_id, None)
        program = self._opened.pop(run_id, None)
        if program is not None:
            self.events.emit("program_end", program)

    # model calls: remembered so that ChatHarness finds its run's program
    def on_chat_model_start(self, serialized: dict[str, Any] | None,
                            messages: list[list[BaseMessage]], *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._inherit(run_id, parent_run_id)

    def on_llm_start(self, serialized: dict[str, Any] | None, prompts: list[str], *,
                     run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        self._inherit(run_id, parent_run_id)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    # tools: interceptions
    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        program = self._inherit(run_id, parent_run_id)
        if program is None:
            return
        tool = str((serialized or {}).get("name") or kwargs.get("name") or "tool")[:128]
        self._tools[run_id] = (program, tool, time.monotonic())
        tool_started(self.events, self.durations, program, tool, str(input_str),
                     gaps=self.gaps)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        content = getattr(output, "content", output)  # a ToolMessage or the raw output
        self._tool_done(run_id, content if isinstance(content, str) else str(content))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._tool_done(run_id, f"{type(error).__name__}: {error}")

    def _tool_done(self, run_id: UUID, output: str) -> None:
        self._runs.pop(run_id, None)
        started = self._tools.pop(run_id, None)
        if started is not None:
            program, tool, t0 = started
            tool_ended(self.events, self.durations, program, tool, time.monotonic() - t0,
                       output, self.gaps)


# -- the chat model ---------------------------------------------------------------------------


class ChatHarness(BaseChatModel):
    """Chat model for `harness serve` or any OpenAI-compatible chat-completions endpoint.

    Besides the standard parameters it carries `program_id` (sent as `session_id`) and `hints`
    (sent as `vllm_xargs`; a call's `hints=` keyword is merged over them). Errors (server gone,
    timeouts after `max_retries` retries, 4xx answers) raise `harness.model_client.ModelError`.
    """

    model: str = DEFAULT_MODEL
    """The served model name; a model folder, a GGUF file or a known model's alias (as
    `harness serve --model` takes them) becomes the name that server serves it under."""
    base_url: str = Field(default_factory=from_env("HARNESS_BASE_URL", default=DEFAULT_BASE_URL))
    """Server root, with or without a trailing `/v1`."""
    api_key: SecretStr = Field(
        default_factory=secret_from_env("HARNESS_API_KEY", default="unused"))
    temperature: float | None = None
    max_tokens: int | None = None
    timeout: float | None = 600.0
    """Seconds per HTTP operation (connect, read a chunk, ...); None: no limit."""
    stop: list[str] | None = None
    max_retries: int = 2
    """Retries of connection errors, timeouts and 5xx answers, with exponential backoff."""
    backoff_s: float = 0.5
    streaming: bool = False
    program_id: str | None = None
    hints: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More chat-completions body fields (`top_p`, `seed`, ...)."""
    http_client: Any = Field(default=None, exclude=True)
    """An `httpx.Client` to use instead of our own."""
    http_async_client: Any = Field(default=None, exclude=True)
    """An `httpx.AsyncClient` to use instead of our own (one per event loop)."""

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    _client: httpx.Client | None = PrivateAttr(default=None)
    _aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = \
        PrivateAttr(default_factory=weakref.WeakKeyDictionary)

    @field_validator("model")
    @classmethod
    def _served_model(cls, model: str) -> str:
        return served_name(model)

    @property
    def _llm_type(self) -> str:
        return "harness"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model, "base_url": self.base_url, "temperature": self.temperature,
                "max_tokens": self.max_tokens, "stop": self.stop}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "harness"
        if "ls_stop" not in params and self.stop:
            params["ls_stop"] = self.stop
        return params

    # -- programs and events -------------------------------------------------------------
    @property
    def url(self) -> str:
        return api_root(self.base_url) + "/v1/chat/completions"

    @property
    def events(self) -> BackgroundEventClient:
        """The shared event client for this model's server."""
        key = self.api_key.get_secret_value()
        return shared_events(self.base_url, None if key == "unused" else key)

    def with_program(self, program_id: str) -> ChatHarness:
        """A copy of this model whose calls belong to `program_id`."""
        return self.model_copy(update={"program_id": program_id})

    def program(self, program_id: str | None = None, *,
                events: EventSink | None = None) -> ProgramScope:
        """`with llm.program() as pid:` (or `async with`): one agent program, announced with
        `program_start` / `program_end`; calls inside it carry its id."""
        return ProgramScope(events if events is not None else self.events, program_id)

    def callback_handler(self, **options: Any) -> HarnessCallbackHandler:
        """A `HarnessCallbackHandler` sending to this model's server."""
        return HarnessCallbackHandler(self.events, **options)

    def _program(self, run_manager: Any) -> str | None:
        if self.program_id:
            return self.program_id
        for handler in getattr(run_manager, "handlers", None) or []:
            if isinstance(handler, HarnessCallbackHandler):
                program = handler.program_for(run_manager.run_id)
                if program is not None:
                    return program
        return current_program()

    # -- tools ---------------------------------------------------------------------------
    def bind_tools(self, tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
                   *, tool_choice: dict[str, Any] | str | bool | None = None,
                   strict: bool | None = None, parallel_tool_calls: bool | None = None,
                   **kwargs: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools in the OpenAI schema. `tool_choice`: "auto", "none", "any"/"required"/
        True (some tool must be called), a tool name, or an OpenAI tool-choice dict."""
        formatted = [convert_to_openai_tool(t, strict=strict) for t in tools]
        if tool_choice is not None and tool_choice is not False:
            kwargs["tool_choice"] = _tool_choice(tool_choice)
        elif tool_choice is False:
            kwargs["tool_choice"] = "none"
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return self.bind(tools=formatted, **kwargs)

    # -- requests ------------------------------------------------------------------------
    def _body(self, messages: list[BaseMessage], stop: list[str] | None, run_manager: Any,
              kwargs: dict[str, Any], stream: bool) -> dict[str, Any]:
        params = dict(kwargs)
        params.pop("stream", None)
        program_id = params.pop("program_id", None) or self._program(run_manager)
        hints = {**self.hints, **(params.pop("hints", None) or {})}
        defaults = {"temperature": self.temperature, "max_tokens": self.max_tokens,
                    "stop": (stop if stop is not None else self.stop) or None}
        params = {**{k: v for k, v in defaults.items() if v is not None}, **self.model_kwargs,
                  **params}
        model = params.pop("model", None) or self.model
        return chat_body(model, convert_to_openai_messages(messages), program_id=program_id,
                         hints=hints, stream=stream, **params)

    @property
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key.get_secret_value()}"}

    def _sync_client(self) -> httpx.Client:
        if self.http_client is not None:
            return self.http_client  # type: ignore[no-any-return]
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        return self._client

    def _async_client(self) -> httpx.AsyncClient:
        if self.http_async_client is not None:
            return self.http_async_client  # type: ignore[no-any-return]
        loop = asyncio.get_running_loop()
        client = self._aclients.get(loop)
        if client is None:  # httpx connections belong to the loop that opened them
            client = self._aclients[loop] = httpx.AsyncClient(timeout=self.timeout)
        return client

    def close(self) -> None:
        """Close the HTTP client this model made for synchronous calls (not one passed in;
        copies made by `with_program` share it)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the HTTP client this model made for the running event loop."""
        client = self._aclients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def _open(self, body: dict[str, Any]) -> httpx.Response:
        """POST, retrying transient failures; the caller reads and closes the response."""
        client, url = self._sync_client(), self.url

        def send() -> httpx.Response:
            request = client.build_request("POST", url, json=body,
                                           headers={**self._headers, **session_headers(body)})
            try:
                response = client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise unreachable(url, exc) from exc
            if response.status_code != 200:
                text = response.read().decode(errors="replace")
                response.close()
                raise status_error(response.status_code, text)
            return response

        return retrying(send, self.max_retries, self.backoff_s)

    async def _aopen(self, body: dict[str, Any]) -> httpx.Response:
        client, url = self._async_client(), self.url

        async def send() -> httpx.Response:
            request = client.build_request("POST", url, json=body,
                                           headers={**self._headers, **session_headers(body)})
            try:
                response = await client.send(request, stream=True)
            except httpx.TransportError as exc:
                raise unreachable(url, exc) from exc
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                await response.aclose()
                raise status_error(response.status_code, text)
            return response

        return await aretrying(send, self.max_retries, self.backoff_s)

    def _broken(self, exc: Exception) -> ModelError:
        return ModelError(f"model server at {self.url} stopped answering: "
                          f"{type(exc).__name__}: {exc}")

    # -- BaseChatModel -------------------------------------------------------------------
    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None,
                  **kwargs: Any) -> ChatResult:
        response = self._open(self._body(messages, stop, run_manager, kwargs, stream=False))
        try:
            data = json.loads(response.read())
        except httpx.TransportError as exc:
            raise self._broken(exc) from exc
        finally:
            response.close()
        return _chat_result(data)

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        response = await self._aopen(self._body(messages, stop, run_manager, kwargs,
                                                stream=False))
        try:
            data = json.loads(await response.aread())
        except httpx.TransportError as exc:
            raise self._broken(exc) from exc
        finally:
            await response.aclose()
        return _chat_result(data)

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None,
                **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        response = self._open(self._body(messages, stop, run_manager, kwargs, stream=True))
        last = False
        try:
            for data in iter_sse(response.iter_text()):
                chunk = _chunk(data)
                if chunk is not None:
                    last = last or getattr(chunk.message, "chunk_position", None) == "last"
                    if run_manager is not None:
                        run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        except httpx.TransportError as exc:
            raise self._broken(exc) from exc
        finally:
            response.close()
        if not last:
            yield _last_chunk()

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        response = await self._aopen(self._body(messages, stop, run_manager, kwargs,
                                                stream=True))
        last = False
        try:
            async for data in aiter_sse(response.aiter_text()):
                chunk = _chunk(data)
                if chunk is not None:
                    last = last or getattr(chunk.message, "chunk_position", None) == "last"
                    if run_manager is not None:
                        await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        except httpx.TransportError as exc:
            raise self._broken(exc) from exc
        finally:
            await response.aclose()
        if not last:
            yield _last_chunk()


def _tool_choice(choice: dict[str, Any] | str | bool) -> dict[str, Any] | str:
    if choice is True or choice in ("any", "required"):
        return "required"
    if isinstance(choice, str) and choice not in ("auto", "none"):
        return {"type": "function", "function": {"name": choice}}
    return choice  # type: ignore[return-value]


def _usage(usage: dict[str, Any] | None) -> UsageMetadata | None:
    if not usage:
        return None
    prompt, completion, cached = usage_counts(usage)
    return UsageMetadata(input_tokens=prompt, output_tokens=completion,
                         total_tokens=int(usage.get("total_tokens") or prompt + completion),
                         input_token_details=InputTokenDetails(cache_read=cached))


def _tool_calls(raw_calls: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    calls, invalid = [], []
    for raw in raw_calls:
        try:
            call = parse_tool_call(raw, return_id=True)
        except Exception as exc:  # noqa: BLE001 - arguments that are not JSON: kept as invalid
            invalid.append(make_invalid_tool_call(raw, str(exc)))
            continue
        if call is not None:
            calls.append(call)
    return calls, invalid


def _chat_result(data: dict[str, Any]) -> ChatResult:
    usage = _usage(data.get("usage"))
    generations = []
    for choice in data.get("choices") or []:
        message = choice.get("message") or {}
        calls, invalid = _tool_calls(message.get("tool_calls") or [])
        finish = choice.get("finish_reason")
        ai = AIMessage(content=message.get("content") or "", tool_calls=calls,
                       invalid_tool_calls=invalid, usage_metadata=usage, id=data.get("id"),
                       response_metadata={"model_name": data.get("model"),
                                          "finish_reason": finish})
        generations.append(ChatGeneration(message=ai, generation_info={"finish_reason": finish}))
    if not generations:
        raise ModelError(f"model server answered without choices: {json.dumps(data)[:500]}")
    return ChatResult(generations=generations,
                      llm_output={"model_name": data.get("model"),
                                  "token_usage": data.get("usage")})


def _chunk(data: dict[str, Any]) -> ChatGenerationChunk | None:
    """One SSE chunk as a LangChain chunk: content, tool-call deltas, finish reason, usage."""
    usage = _usage(data.get("usage"))
    choices = data.get("choices") or []
    if not choices:
        if usage is None:
            return None
        return ChatGenerationChunk(message=AIMessageChunk(
            content="", usage_metadata=usage, id=data.get("id"), chunk_position="last"))
    choice = choices[0]
    delta = choice.get("delta") or {}
    calls = [tool_call_chunk(name=(c.get("function") or {}).get("name"),
                             args=(c.get("function") or {}).get("arguments"),
                             id=c.get("id"), index=c.get("index"))
             for c in delta.get("tool_calls") or []]
    finish = choice.get("finish_reason")
    metadata = {"finish_reason": finish, "model_name": data.get("model")} if finish else {}
    message = AIMessageChunk(content=delta.get("content") or "", tool_call_chunks=calls,
                             usage_metadata=usage, response_metadata=metadata,
                             id=data.get("id"))
    return ChatGenerationChunk(message=message,
                               generation_info={"finish_reason": finish} if finish else None)


def _last_chunk() -> ChatGenerationChunk:
    position: Literal["last"] = "last"
    return ChatGenerationChunk(message=AIMessageChunk(content="", chunk_position=position))
