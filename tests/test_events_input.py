"""Bad input at `POST /v1/agent/events`, the table of docs/events.md walked case by case on
both endpoints that take events: the engine's (our vLLM plugin, in process) and the cluster
router's. Each case is answered with the status the table gives and a message that says what
is wrong; none with a 500. Both endpoints run with two tenants' keys, so that the 403 case is
live."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from event_apps import ROUTE, bearer, chat_body, engine_app, router_app
from fastapi.testclient import TestClient

from server.intake.events import MAX_BODY_BYTES, EventsTooLarge, read_body

A, B = "sk-tenant-a", "sk-tenant-b"
#: A program tenant A opened (with a chat request) before each case.
OWNED = "owned-by-a"


def event(**fields: Any) -> bytes:
    return json.dumps({"type": "tool_start", "program_id": "p", **fields}).encode()


#: (case, body, key, status, what the message says): docs/events.md, "What is refused".
CASES: list[tuple[str, bytes, str | None, int, str]] = [
    ("valid", event(tool="bash", predicted_s=1.5), A, 200, ""),
    ("valid NDJSON", event() + b"\n\n" + event(), A, 200, ""),
    ("empty body", b"  \n", A, 400, "empty body"),
    ("not JSON", b'{"type": "tool_start", ', A, 400, "line 1 is not JSON"),
    ("not JSON on line 2", event() + b"\nnope", A, 400, "line 2 is not JSON"),
    ("nested too deeply", b"[" * 100_000, A, 400, "nested too deeply"),
    ("not an object", b'["tool_start"]', A, 400, "event 1: event: Input should be a valid "
                                                 "dictionary"),
    ("unknown type", event(type="tool_stop"), A, 400, "event 1: type: Input should be"),
    ("missing program_id", b'{"type": "tool_start"}', A, 400, "program_id: Field required"),
    ("empty program_id", event(program_id=""), A, 400, "program_id: String should have at "
                                                       "least 1 character"),
    ("ill-typed field", event(predicted_s="soon"), A, 400, "predicted_s: Input should be a "
                                                           "valid number"),
    ("negative duration", event(seconds=-1), A, 400, "seconds: Input should be greater than "
                                                     "or equal to 0"),
    ("non-finite number", b'{"type": "tool_end", "program_id": "p", "seconds": Infinity}', A,
     400, "seconds: Input should be a finite number"),
    ("fractional token count", event(return_tokens=1.5), A, 400, "return_tokens"),
    ("unknown field", event(tool_name="bash"), A, 400, "tool_name: Extra inputs are not "
                                                       "permitted"),
    ("second event bad", event() + b"\n" + event(type="nope"), A, 400, "event 2: type"),
    ("over 1 MiB", b" " * MAX_BODY_BYTES + event(), A, 413, "over 1,048,576 bytes"),
    ("unknown program", event(program_id="nobody-opened-this"), A, 200, ""),
    ("another tenant's program", event(program_id=OWNED), B, 403,
     f"event 1: program '{OWNED}' was opened with another API key"),
    ("no key", event(), None, 401, ""),
]


@pytest.fixture(params=["engine", "router"])
def endpoint(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("HARNESS_EVENTS_IPC", raising=False)
    app = engine_app([A, B])[0] if request.param == "engine" else router_app([A, B])[0]
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body(OWNED),
                           headers=bearer(A)).status_code == 200
        yield request.param, client


@pytest.mark.parametrize("case, body, key, status, says", CASES, ids=[c[0] for c in CASES])
def test_each_case_of_the_table(endpoint: Any, case: str, body: bytes, key: str | None,
                                status: int, says: str) -> None:
    where, client = endpoint
    answer = client.post(ROUTE, content=body, headers=bearer(key) if key else {})
    assert answer.status_code == status, (where, answer.text)
    if status == 200:
        assert answer.json()["accepted"] == len([x for x in body.splitlines() if x.strip()])
    elif status != 401:  # the key check's own answer, before the endpoint
        assert says in answer.json()["error"], (where, answer.text)
        refused = client.get(ROUTE, headers=bearer(A)).json()["refused"]
        assert refused[{400: "invalid", 403: "not_owner", 413: "too_large"}[status]] == 1


def test_the_table_in_the_docs_lists_every_case():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "events.md").read_text()
    section = text.split("### What is refused", 1)[1].split("\n#", 1)[0]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines()
            if line.startswith("| ")}
    for case, _, _, status, _ in CASES:
        assert f"| {status} |" in rows[case], case


def test_a_large_body_is_refused_before_it_is_read():
    async def chunks(sizes: list[int], seen: list[int]) -> Any:
        for size in sizes:
            seen.append(size)
            yield b"x" * size

    async def read(sizes: list[int], declared: str | None) -> list[int]:
        seen: list[int] = []
        with pytest.raises(EventsTooLarge):
            await read_body(chunks(sizes, seen), declared)
        return seen

    # its Content-Length says so: nothing read; streamed without one: read up to the limit
    assert asyncio.run(read([10], str(MAX_BODY_BYTES + 1))) == []
    assert asyncio.run(read([MAX_BODY_BYTES, 1, 1 << 30], None)) == [MAX_BODY_BYTES, 1]
    assert asyncio.run(read_body(chunks([3, 4], []), "7")) == b"x" * 7
