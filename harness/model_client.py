"""Chat-completions client for any OpenAI-compatible endpoint, carrying program ids and hints.

The program id travels as vLLM's `session_id` and the hints as `vllm_xargs`, which is how the
scheduler learns which turns belong together. Connection errors and 5xx answers are retried
with exponential backoff; a 4xx is the caller's mistake and raised at once with the server's
message.
"""

from __future__ import annotations

import asyncio
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


class ChatClient:
    def __init__(self, base_url: str, model: str, *, api_key: str = "unused",
                 timeout_s: float = 600.0, max_retries: int = 4,
                 backoff_s: float = 0.5) -> None:
        self.url = base_url.rstrip("/") + "/v1/chat/completions"
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
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
        started = time.monotonic()
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._client.post(self.url, json=body)
            except httpx.TransportError as exc:
                if attempt == self.max_retries:
                    raise ModelError(f"model server unreachable at {self.url}: {exc}") from exc
            else:
                if response.status_code < 500:
                    break
                if attempt == self.max_retries:
                    raise ModelError(f"model server error {response.status_code}: "
                                     f"{response.text[:500]}")
            await asyncio.sleep(self.backoff_s * 2**attempt)
        if response.status_code != 200:
            raise ModelError(f"model request rejected ({response.status_code}): "
                             f"{response.text[:500]}")
        data = response.json()
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        choice = data["choices"][0]
        return Completion(text=choice["message"].get("content") or "",
                          finish_reason=choice.get("finish_reason"),
                          prompt_tokens=int(usage.get("prompt_tokens", 0)),
                          completion_tokens=int(usage.get("completion_tokens", 0)),
                          cached_tokens=int(details.get("cached_tokens") or 0),
                          seconds=time.monotonic() - started, raw=data)

    async def aclose(self) -> None:
        await self._client.aclose()
