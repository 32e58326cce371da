"""Chat-completions client for any OpenAI-compatible endpoint, carrying program ids and hints.

The program id travels as vLLM's `session_id` and the hints as `vllm_xargs`, which is how the
scheduler learns which turns belong together. With `agentic_context=True` the hints also travel
in the ecosystem's canonical shape, `vllm_xargs.agentic_context` (`common.agentic_context`), which
`vllm-router`'s program scheduling reads; our server accepts it (`server.intake.agentic_context`), a
stock vLLM server answers it with a 400, so it is off by default. Connection errors and 5xx
answers are retried with exponential backoff; a 4xx is the caller's mistake and raised at once
with the server's message.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from common.agentic_context import AGENTIC_CONTEXT_KEY
from common.agentic_context import agentic_context as canonical_context


class ModelError(RuntimeError):
    pass


class TransientModelError(ModelError):
    """A connection error or a 5xx: worth another try."""


class ContextLimit(ModelError):
    """The server refused the request because the prompt does not fit its context (vLLM: "...
    longer than the maximum model length ...", OpenAI: "maximum context length"): the program
    cannot go on, and retrying cannot help."""


#: How servers word "the prompt does not fit" in a 400 answer.
CONTEXT_LIMIT_PHRASES = ("maximum model length", "maximum context length",
                         "context_length_exceeded")


class ModelUnavailable(ModelError):
    """The server stayed unreachable (or kept answering 5xx) through every retry: the server
    is down or broken, not the request. A run keeps the program's task for `--resume`."""


T = TypeVar("T")


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    seconds: float
    raw: dict[str, Any]
    ttft_s: float | None = None  # time to the first content token (streaming only)
    # the token ids the server used (vLLM, when asked with `return_token_ids`), else None
    prompt_token_ids: list[int] | None = None
    output_token_ids: list[int] | None = None


@dataclass(frozen=True)
class Retries:
    """How a request that fails for a passing reason (a connection error, a 5xx) is tried
    again: up to `max_retries` more times, waiting `backoff_s`, then twice as long each time
    (`retrying`)."""

    max_retries: int = 4
    backoff_s: float = 0.5


class ChatClient:
    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 600.0, retries: Retries = Retries(), stream: bool = True,
                 token_ids: bool = False, agentic_context: bool = False) -> None:
        """`token_ids`: ask for the prompt and output token ids (`return_token_ids`, a vLLM
        extension other OpenAI servers may reject), and with stop strings for the stop string
        in the reply (`include_stop_str_in_output`, vLLM too): the output token ids hold the
        stop string's tokens, so the text kept in the history must hold it as well.
        `agentic_context`: send the hints in the canonical `vllm_xargs.agentic_context` too
        (for `vllm-router`'s program scheduling; our server accepts it, a stock vLLM server
        does not). `api_key`: sent as `Authorization: Bearer KEY` (a server started with
        `--api-key`); None sends no key."""
        self.url = api_root(base_url) + "/v1/chat/completions"
        self.token_ids = token_ids
        self.agentic_context = agentic_context
        self.model = model
        self.retries = retries
        self.stream = stream
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=auth_headers(api_key))

    async def complete(self, messages: list[dict[str, Any]], *, program_id: str | None = None,
                       max_tokens: int = 512, temperature: float = 0.0,
                       hints: dict[str, Any] | None = None, **extra: Any) -> Completion:
        body = chat_body(self.model, messages, program_id=program_id, hints=hints,
                         stream=self.stream, max_tokens=max_tokens, temperature=temperature,
                         agentic_context=self.agentic_context, **extra)
        if self.token_ids:
            body["return_token_ids"] = True
            if body.get("stop"):
                body["include_stop_str_in_output"] = True
        started = time.monotonic()
        return await aretrying(lambda: self._send(body, started), self.retries.max_retries,
                               self.retries.backoff_s)

    async def _send(self, body: dict[str, Any], started: float) -> Completion:
        try:
            async with self._client.stream("POST", self.url, json=body,
                                           headers=session_headers(body)) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise status_error(response.status_code, text)
                if body.get("stream"):
                    return await self._read_stream(response, started)
                data = json.loads(await response.aread())
        except httpx.TransportError as exc:
            raise unreachable(self.url, exc) from exc
        return _completion(data, time.monotonic() - started)

    async def _read_stream(self, response: httpx.Response, started: float) -> Completion:
        """Server-sent events: content deltas, tool-call deltas, then a usage chunk."""
        parts: list[str] = []
        tool_calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: dict[str, Any] = {}
        ttft: float | None = None
        prompt_ids: list[int] | None = None
        output_ids: list[int] | None = None
        async for chunk in aiter_sse(response.aiter_text()):
            usage = chunk.get("usage") or usage
            if chunk.get("prompt_token_ids") is not None:  # the first chunk, when asked
                prompt_ids = list(chunk["prompt_token_ids"])
            for choice in chunk.get("choices") or []:
                if choice.get("token_ids") is not None:  # extend in place: one chunk a token
                    output_ids = output_ids if output_ids is not None else []
                    output_ids.extend(choice["token_ids"])
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    ttft = ttft if ttft is not None else time.monotonic() - started
                    parts.append(delta["content"])
                for call in delta.get("tool_calls") or []:
                    ttft = ttft if ttft is not None else time.monotonic() - started
                    slot = tool_calls.setdefault(call.get("index", 0),
                                                 {"id": None, "type": "function",
                                                  "function": {"name": "", "arguments": ""}})
                    slot["id"] = call.get("id") or slot["id"]
                    function = call.get("function") or {}
                    slot["function"]["name"] += function.get("name") or ""
                    slot["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        message: dict[str, Any] = {"role": "assistant", "content": "".join(parts)}
        if tool_calls:
            message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
        data = {"choices": [{"message": message, "finish_reason": finish,
                             "token_ids": output_ids}],
                "usage": usage, "prompt_token_ids": prompt_ids}
        completion = _completion(data, time.monotonic() - started)
        completion.ttft_s = ttft
        return completion

    async def aclose(self) -> None:
        await self._client.aclose()


def api_root(url: str) -> str:
    """`http://host:port` from what a user types for a server: `host:port`, `http://host:port`,
    with or without a trailing `/` or `/v1`. Every client appends its own `/v1/...` path."""
    root = url.strip().rstrip("/")
    if "://" not in root:
        root = "http://" + root
    return root.removesuffix("/v1")


#: Where the key for a server started with `--api-key` comes from when none is given, first
#: set wins: ours (the LangChain model reads it too), then the one OpenAI clients read. Ours
#: first so that a real OpenAI key in the environment is not what a harness server is sent.
API_KEY_VARS = ("HARNESS_API_KEY", "OPENAI_API_KEY")


def api_key_of(given: str | None) -> str | None:
    """The key to send: `given` (`--api-key`), else the first of `API_KEY_VARS` set."""
    return given or next((os.environ[v] for v in API_KEY_VARS if os.environ.get(v)), None)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The `Authorization` header vLLM's `--api-key` check reads (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


#: The program id as a header too: vLLM reads the body's `session_id`, but routers in front of
#: replicas (ours, `vllm-router`'s consistent hash) hash this header, not the body.
SESSION_HEADER = "X-Session-ID"


def session_headers(body: dict[str, Any]) -> dict[str, str]:
    """`{X-Session-ID: program id}` for a body that carries one, else nothing."""
    session = body.get("session_id")
    return {SESSION_HEADER: str(session)} if session is not None else {}


def chat_body(model: str, messages: list[dict[str, Any]], *, program_id: str | None = None,
              hints: dict[str, Any] | None = None, stream: bool = False,
              agentic_context: bool = False, **params: Any) -> dict[str, Any]:
    """A chat-completions body carrying the program id (`session_id`) and the hints
    (`vllm_xargs`, None values left out; with `agentic_context` and a program id, also as
    the canonical `vllm_xargs.agentic_context`); a streamed body asks for the usage chunk."""
    body: dict[str, Any] = {"model": model, "messages": messages, **params}
    if program_id is not None:
        body["session_id"] = program_id
    if hints or (agentic_context and program_id is not None):
        body["vllm_xargs"] = with_agentic_context(
            {k: v for k, v in (hints or {}).items() if v is not None},
            program_id if agentic_context else None)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def with_agentic_context(xargs: dict[str, Any], program_id: str | None) -> dict[str, Any]:
    """`xargs` plus the canonical `agentic_context` of `program_id` built from them (`xargs`
    unchanged when `program_id` is None)."""
    if program_id is None:
        return xargs
    return {**xargs, AGENTIC_CONTEXT_KEY: canonical_context(program_id, xargs)}


def status_error(status_code: int, text: str) -> ModelError:
    """The error for a non-200 answer: a 5xx is worth a retry, anything else is not."""
    if status_code >= 500:
        return TransientModelError(f"model server error {status_code}: {text[:500]}")
    if status_code == 400 and any(p in text.lower() for p in CONTEXT_LIMIT_PHRASES):
        return ContextLimit(f"the prompt no longer fits the model's context ({status_code}): "
                            f"{text[:500]}")
    return ModelError(f"model request rejected ({status_code}): {text[:500]}")


def unreachable(url: str, exc: Exception) -> TransientModelError:
    return TransientModelError(f"model server unreachable at {url}: "
                               f"{type(exc).__name__}: {exc}")


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens from an OpenAI `usage` object."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return (int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0))


_DONE: Any = object()


def _sse_json(line: str) -> Any:
    """One server-sent-events line: its JSON, None (not a data line) or `_DONE`."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    return _DONE if payload == "[DONE]" else json.loads(payload)


class SseLines:
    """The lines of a server-sent-events stream from its text as it arrives: split at line
    feeds only (a trailing carriage return dropped), as the SSE format ends its lines. Not
    `httpx`'s `iter_lines`, which splits as `str.splitlines` does, also at U+2028, U+0085
    and the other separators JSON leaves unescaped inside a string: a token whose text holds
    one cut its chunk in two, and the halves did not parse."""

    def __init__(self) -> None:
        self.pending = ""

    def feed(self, text: str) -> list[str]:
        """The lines `text` completes."""
        *lines, self.pending = (self.pending + text).split("\n")
        return [line.removesuffix("\r") for line in lines]

    def close(self) -> list[str]:
        """The last line, if the stream did not end it."""
        rest, self.pending = self.pending, ""
        return [rest.removesuffix("\r")] if rest else []


def sse_lines(chunks: Iterable[str]) -> Iterator[str]:
    """`SseLines` over a stream's text (`response.iter_text()`)."""
    splitter = SseLines()
    for text in chunks:
        yield from splitter.feed(text)
    yield from splitter.close()


async def asse_lines(chunks: AsyncIterable[str]) -> AsyncIterator[str]:
    """`SseLines` over an async stream's text (`response.aiter_text()`)."""
    splitter = SseLines()
    async for text in chunks:
        for line in splitter.feed(text):
            yield line
    for line in splitter.close():
        yield line


def iter_sse(chunks: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of an OpenAI stream, up to `data: [DONE]`, from its text
    (`response.iter_text()`)."""
    for line in sse_lines(chunks):
        chunk = _sse_json(line)
        if chunk is _DONE:
            return
        if chunk is not None:
            yield chunk


async def aiter_sse(chunks: AsyncIterable[str]) -> AsyncIterator[dict[str, Any]]:
    """`iter_sse` over the text of an async stream (`response.aiter_text()`). After
    `data: [DONE]` the rest of the stream is read to its end, so that the response is
    complete before the caller closes it: a proxy in between (vllm-router) otherwise sees the
    client go away and counts a failed request."""
    done = False
    async for line in asse_lines(chunks):
        if done:
            continue
        chunk = _sse_json(line)
        if chunk is _DONE:
            done = True
        elif chunk is not None:
            yield chunk


def retrying(send: Callable[[], T], max_retries: int, backoff_s: float) -> T:
    """Call `send`, retrying a `TransientModelError` with exponential backoff; after the last
    try it is raised as `ModelUnavailable` (a `ModelError`) saying how long it tried."""
    started = time.monotonic()
    for attempt in range(max_retries + 1):
        try:
            return send()
        except TransientModelError as exc:
            if attempt == max_retries:
                raise gave_up(exc, attempt + 1, time.monotonic() - started) from exc
        time.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")


async def aretrying(send: Callable[[], Awaitable[T]], max_retries: int, backoff_s: float) -> T:
    """`retrying` for a coroutine function."""
    started = time.monotonic()
    for attempt in range(max_retries + 1):
        try:
            return await send()
        except TransientModelError as exc:
            if attempt == max_retries:
                raise gave_up(exc, attempt + 1, time.monotonic() - started) from exc
        await asyncio.sleep(backoff_s * 2**attempt)
    raise AssertionError("unreachable")


def gave_up(exc: TransientModelError, tries: int, seconds: float) -> ModelUnavailable:
    """The error after the last retry: what the server last did, and how long we tried."""
    return ModelUnavailable(f"{exc} (gave up after {tries} tries over {seconds:.1f} s)")


def _completion(data: dict[str, Any], seconds: float) -> Completion:
    prompt, completion, cached = usage_counts(data.get("usage"))
    choice = data["choices"][0]
    return Completion(text=choice["message"].get("content") or "",
                      finish_reason=choice.get("finish_reason"),
                      prompt_tokens=prompt, completion_tokens=completion,
                      cached_tokens=cached, seconds=seconds, raw=data,
                      prompt_token_ids=_ids(data.get("prompt_token_ids")),
                      output_token_ids=_ids(choice.get("token_ids")))


def _ids(value: Any) -> list[int] | None:
    return [int(t) for t in value] if isinstance(value, list) else None
