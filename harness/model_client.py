"""Chat-completions client for any OpenAI-compatible endpoint, carrying program ids and hints.

The program id travels as vLLM's `session_id` and the hints as `vllm_xargs`, which is how the
scheduler learns which turns belong together. Connection errors and 5xx answers are retried
with exponential backoff; a 4xx is the caller's mistake and raised at once with the server's
message.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


class ModelError(RuntimeError):
    pass


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


class ChatClient:
    def __init__(self, base_url: str, model: str, *, api_key: str = "unused",
                 timeout_s: float = 600.0, max_retries: int = 4,
                 backoff_s: float = 0.5, stream: bool = True) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.stream = stream
        self._client = httpx.AsyncClient(timeout=timeout_s,
                                         headers={"Authorization": f"Bearer {api_key}"})

    async def complete(self, messages: list[dict[str, Any]], *, program_id: str | None = None,
                       max_tokens: int = 512, temperature: float = 0.0,
                       hints: dict[str, Any] | None = None, **extra: Any) -> Completion:
        body: dict[str, Any] = {"model": self.model, "messages": messages,
                                "max_tokens": max_tokens, "temperature": temperature, **extra}
        if program_id is not None:
            body["session_id"] = program_id
        if hints:
            body["vllm_xargs"] = {k: v for k, v in hints.items() if v is not None}
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        started = time.monotonic()
        for attempt in range(self.max_retries + 1):
            try:
                return await self._send(body, started)
            except _Retryable as exc:
                if attempt == self.max_retries:
                    raise ModelError(str(exc)) from exc
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    async def _send(self, body: dict[str, Any], started: float) -> Completion:
        try:
            async with self._client.stream("POST", self.url, json=body) as response:
                if response.status_code >= 500:
                    text = (await response.aread()).decode(errors="replace")
                    raise _Retryable(f"model server error {response.status_code}: {text[:500]}")
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    raise ModelError(f"model request rejected ({response.status_code}): "
                                     f"{text[:500]}")
                if body.get("stream"):
                    return await self._read_stream(response, started)
                data = json.loads(await response.aread())
        except httpx.TransportError as exc:
            raise _Retryable(f"model server unreachable at {self.url}: {exc}") from exc
        return _completion(data, time.monotonic() - started)

    async def _read_stream(self, response: httpx.Response, started: float) -> Completion:
        """Server-sent events: content deltas, tool-call deltas, then a usage chunk."""
        parts: list[str] = []
        tool_calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: dict[str, Any] = {}
        ttft: float | None = None
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
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
        data = {"choices": [{"message": message, "finish_reason": finish}], "usage": usage}
        completion = _completion(data, time.monotonic() - started)
        completion.ttft_s = ttft
        return completion

    async def aclose(self) -> None:
        await self._client.aclose()


class _Retryable(Exception):
    """A connection error or a 5xx: worth another try."""


def _completion(data: dict[str, Any], seconds: float) -> Completion:
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    choice = data["choices"][0]
    return Completion(text=choice["message"].get("content") or "",
                      finish_reason=choice.get("finish_reason"),
                      prompt_tokens=int(usage.get("prompt_tokens", 0)),
                      completion_tokens=int(usage.get("completion_tokens", 0)),
                      cached_tokens=int(details.get("cached_tokens") or 0),
                      seconds=seconds, raw=data)
