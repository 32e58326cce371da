"""`harness serve` accepts the canonical `vllm_xargs.agentic_context` (a nested object that
stock vLLM rejects), and the hints it implies reach the engine's sampling parameters.

One emulated server (policy vllm) with vLLM's request log on: a completions request whose
only hints are the canonical object answers 200, and the log shows the `turn` and session it
implied plus the object as JSON text; any other nested `vllm_xargs` value is still vLLM's 400.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from harness.server_process import ServerProcess

pytestmark = pytest.mark.server


def test_served_requests_may_carry_the_canonical_agentic_context(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with ServerProcess(policy="vllm", vllm_args=["--enable-log-requests"], log_path=log,
                       env={"VLLM_LOGGING_LEVEL": "INFO"}) as server:
        url = f"{server.base_url}/v1/completions"
        model = httpx.get(f"{server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
        context = {"program_id": "prog-7", "step_id": 3, "expected_resume": True,
                   "kv_retention_ttl_seconds": 5}
        body = {"model": model, "prompt": [11, 12, 13, 14], "max_tokens": 2,
                "request_id": "ac-test", "vllm_xargs": {"emulate_output_tokens": 2,
                                                         "agentic_context": context}}
        answer = httpx.post(url, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 2

        nested = {**body, "request_id": "ac-other",
                  "vllm_xargs": {"emulate_output_tokens": 2, "other": {"a": 1}}}
        assert httpx.post(url, json=nested, timeout=60).status_code == 400

    line = next(x for x in log.read_text(errors="replace").splitlines()
                if "Received request cmpl-ac-test" in x)
    assert re.search(r"'turn': 3\b", line), line
    assert "'session_id': 'prog-7'" in line, line
    assert '"kv_retention_ttl_seconds":5' in line, line
