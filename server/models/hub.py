"""The Hugging Face hub as a model source: whether this machine can download from it, and
what its local cache already holds.

Why here: `harness serve --model ORG/NAME` lets vLLM download a model the cache lacks, as
`vllm serve` does, but only when a download can work; otherwise the user gets one line saying
so at once instead of vLLM's retries and a traceback minutes later.

"Online" means both:

* neither `HF_HUB_OFFLINE` nor `TRANSFORMERS_OFFLINE` is set to a true value (1, true, yes,
  on): the switches huggingface_hub, transformers and vLLM obey;
* the hub's host accepts a TCP connection within `PROBE_TIMEOUT_S`: `$HF_ENDPOINT`'s (default
  huggingface.co:443), or the proxy's when `HTTPS_PROXY` is set. A connect is what fails on a
  machine without a route or DNS; whether the model exists, or needs a token, is the hub's
  answer to vLLM, shown in vLLM's words.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def hub_address() -> tuple[str, int]:
    """Where a download would connect first: the HTTPS proxy if one is set, else the hub."""
    url = (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
           or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def offline_reason(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why this machine cannot download from the hub (for a message), or None when it can."""
    for name in OFFLINE_VARS:
        if _true(os.environ.get(name)):
            return f"{name}={os.environ[name]} is set"
    host, port = hub_address()
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{host}:{port} does not answer ({exc.strerror or type(exc).__name__})"


def cached_snapshot(repo_id: str) -> Path | None:
    """The folder of `repo_id` in the local Hugging Face cache, or None (nothing downloaded)."""
    # huggingface_hub: start-up cost, and only hub ids need it
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
