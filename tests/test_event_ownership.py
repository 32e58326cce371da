"""A program belongs to the API key that opened it (`server.intake.ownership`): the shared
class, the engine's events endpoint (our vLLM plugin, in process) and the cluster router's
(local; the Ray router is the same app, `cluster.ray_app.ClusterIngress` builds it with
`create_app`, so these tests are its tests too). An event about another key's program gets a 403
that names the program and not its owner, is counted, and reaches no scheduler; with no key or
one, nothing changes."""

from __future__ import annotations

import time

import pytest
from event_apps import ROUTE, bearer, chat_body, engine_app, router_app
from fastapi.testclient import TestClient

from server.intake.event_plugin import SchedulerCollector, session_of
from server.intake.events import ENV_EVENTS_IPC, EventReceiver, parse_events
from server.intake.ownership import (
    IDLE_FORGET_S,
    PROGRAMS_PER_CREDENTIAL,
    NotOwner,
    ProgramOwners,
    admit_events,
    credential_of,
    events_done,
    several_keys,
)
from server.programs.state import STALE_AFTER_S

A, B, CLUSTER = "sk-tenant-a", "sk-tenant-b", "sk-cluster"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the shared class ------------------------------------------------------------------------

def test_the_first_key_to_name_a_program_owns_it():
    owners = ProgramOwners()
    a, b = credential_of(f"Bearer {A}"), credential_of(f"Bearer {B}")
    assert owners.claim("p", a) and owners.owner("p") == a
    assert owners.claim("p", a)  # the same key again: still its own
    assert not owners.claim("p", b) and owners.owner("p") == a
    # all or nothing: a batch naming one foreign program records none of the others
    assert owners.admit(["q", "p"], b) == 1 and owners.owner("q") is None
    assert owners.admit(["q"], b) is None and owners.owner("q") == b
    owners.forget("p")  # its program_end: the id is free again
    assert owners.claim("p", b)
    assert owners.stats() == {"programs": 2, "credentials": 1, "opened": 3, "ended": 1,
                              "idle": 0, "evicted": 0}


def test_a_credential_is_a_fingerprint_never_the_key():
    fingerprint = credential_of(f"Bearer {A}")
    assert fingerprint is not None and A not in fingerprint and len(fingerprint) == 32
    assert credential_of(f"bearer {A}") == fingerprint  # the scheme in any case, as vLLM
    assert credential_of(None) is None and credential_of("") is None
    assert credential_of(f"Bearer {B}") != fingerprint


def test_tenants_only_with_two_different_keys():
    assert not several_keys([]) and not several_keys([None, ""]) and not several_keys([A, A])
    assert several_keys([A, B]) and several_keys([A, None, B])


def test_the_table_is_bounded_and_a_flood_forgets_only_the_flooders_programs():
    owners = ProgramOwners(per_credential=3)
    a, b = credential_of(f"Bearer {A}"), credential_of(f"Bearer {B}")
    owners.claim("a-1", a)
    for i in range(10):  # B names ten new ids: it keeps its last three, A keeps its own
        owners.claim(f"b-{i}", b)
    assert len(owners) == 4 and owners.owner("a-1") == a
    assert [p for p in (f"b-{i}" for i in range(10)) if owners.owner(p)] == ["b-7", "b-8", "b-9"]
    assert owners.stats()["evicted"] == 7
    owners.claim("b-7", b)  # named again: the most recent now, b-8 goes next
    owners.claim("b-10", b)
    assert owners.owner("b-8") is None and owners.owner("b-7") == b
    assert PROGRAMS_PER_CREDENTIAL == 65_536


def test_a_program_nobody_names_for_the_idle_time_is_forgotten():
    clock = Clock()
    owners = ProgramOwners(clock=clock)
    a, b = credential_of(f"Bearer {A}"), credential_of(f"Bearer {B}")
    owners.claim("old", a)
    clock.now = 100.0
    owners.claim("kept", a)
    clock.now = IDLE_FORGET_S - 1
    assert not owners.claim("old", b)  # still A's
    clock.now = IDLE_FORGET_S + 50.0
    assert owners.claim("old", b)  # forgotten: free for whoever names it first
    assert owners.owner("kept") == a  # named at 100 s: not yet
    assert owners.stats()["idle"] == 1 and owners.stats()["credentials"] == 2
    # as long as a program scheduler remembers a silent program, and no shorter
    assert IDLE_FORGET_S == STALE_AFTER_S


def test_events_are_admitted_whole_and_program_end_frees_the_id():
    owners = ProgramOwners()
    a, b = credential_of(f"Bearer {A}"), credential_of(f"Bearer {B}")
    admit_events(owners, parse_events(b'{"type": "program_start", "program_id": "p"}'), a)
    events = parse_events(b'{"type": "tool_start", "program_id": "q"}\n'
                          b'{"type": "program_end", "program_id": "p"}')
    with pytest.raises(NotOwner) as refused:
        admit_events(owners, events, b)
    assert refused.value.status == 403 and refused.value.reason == "not_owner"
    assert str(refused.value) == ("event 2: program 'p' was opened with another API key; only "
                                  "that key may send events about it")
    assert owners.owner("q") is None
    admit_events(None, events, b)  # one tenant: nothing checked
    ended = parse_events(b'{"type": "program_end", "program_id": "p"}')
    admit_events(owners, ended, a)
    events_done(owners, ended)
    assert owners.owner("p") is None


def test_a_completions_request_names_its_program_as_vllm_reads_it():
    body = b'{"session_id": "s", "vllm_xargs": {"session_id": "x"}}'
    assert session_of(body, {"x-session-id": "h"}) == "s"
    assert session_of(b'{"vllm_xargs": {"session_id": "x"}}', {"x-session-id": "h"}) == "h"
    assert session_of(b'{"vllm_xargs": {"session_id": "x"}}', {}) == "x"
    assert session_of(b'{"model": "m"}', {}) is None
    assert session_of(b"not json session_id", {}) is None
    assert session_of(b'["session_id"]', {"x-session-id": "h"}) == "h"


# -- the engine's endpoint (our vLLM plugin) ---------------------------------------------------

def test_engine_refuses_another_keys_events_and_counts_them(monkeypatch, tmp_path):
    address = f"ipc://{tmp_path}/events.sock"
    monkeypatch.setenv(ENV_EVENTS_IPC, address)
    scheduler = EventReceiver(address)  # what the scheduler would take in
    try:
        app, plugin = engine_app([A, B])
        with TestClient(app) as client:
            # A's chat request opens the program; B's events about it are refused
            assert client.post("/v1/chat/completions", json=chat_body("pa"),
                               headers=bearer(A)).status_code == 200
            refused = client.post(ROUTE, headers=bearer(B), json=[
                {"type": "tool_start", "program_id": "pb"},
                {"type": "program_end", "program_id": "pa"}])
            assert refused.status_code == 403
            message = refused.json()["error"]
            assert message == ("event 2: program 'pa' was opened with another API key; only "
                               "that key may send events about it")
            assert credential_of(f"Bearer {A}") not in message
            # an event opens a program too: B's program_start makes pb B's
            assert client.post(ROUTE, headers=bearer(B), json={
                "type": "program_start", "program_id": "pb"}).status_code == 200
            assert client.post(ROUTE, headers=bearer(A), json={
                "type": "tool_start", "program_id": "pb"}).status_code == 403
            ok = client.post(ROUTE, headers=bearer(A), json={
                "type": "program_end", "program_id": "pa"})
            assert ok.json() == {"accepted": 1, "forwarded": 1}
            stats = client.get(ROUTE, headers=bearer(A)).json()
            assert client.get(ROUTE).status_code == 401  # vLLM's key check stands in front
        deadline = time.monotonic() + 5
        taken = []
        while len(taken) < 2 and time.monotonic() < deadline:
            taken += scheduler.drain()
            time.sleep(0.01)
        # only what was accepted reached the scheduler
        assert [(e.kind, e.program_id) for e in taken] == [("program_start", "pb"),
                                                           ("program_end", "pa")]
    finally:
        scheduler.close()
    assert stats["refused"] == {"invalid": 0, "too_large": 0, "not_owner": 2}
    assert stats["received"] == 2
    assert stats["owners"]["programs"] == 1  # pa ended: only pb is left
    metrics = {(s.name, s.labels.get("reason")): s.value
               for m in SchedulerCollector(None, plugin.refused).collect() for s in m.samples}
    assert metrics[("harness:agent_event_requests_refused_total", "not_owner")] == 2
    assert metrics[("harness:agent_event_requests_refused_total", "invalid")] == 0


@pytest.mark.parametrize("keys", [(), (A,)], ids=["no key", "one key"])
def test_engine_with_no_key_or_one_is_one_tenant(keys, monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app, plugin = engine_app(keys)
    assert plugin.owners is None
    auth = bearer(A) if keys else {}
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body("p"),
                           headers=auth).status_code == 200
        for event in ({"type": "tool_start", "program_id": "p"},
                      {"type": "program_end", "program_id": "p"}):
            answer = client.post(ROUTE, json=event, headers=auth or {"Authorization": "x"})
            assert answer.status_code == 200, answer.text
        assert client.get(ROUTE, headers=auth).json()["owners"] is None


def test_engine_keys_come_from_vllm_options_else_its_variable(monkeypatch):
    from server.intake.event_plugin import server_keys

    monkeypatch.setenv("VLLM_API_KEY", A)
    app, _ = engine_app()
    assert server_keys(app) == [A]
    app, plugin = engine_app([A, B])
    assert server_keys(app) == [A, B] and plugin.owners is not None


@pytest.mark.slow
def test_the_plugin_sits_inside_vllms_own_key_check(monkeypatch):
    """vLLM's real `build_app` with `--api-key K1 K2`: the request watcher is inside vLLM's
    key check (a request without a key opens nothing), and the endpoint answers behind it."""
    monkeypatch.setenv("VLLM_PLUGINS", "harness_agent_events")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    monkeypatch.delenv(ENV_EVENTS_IPC, raising=False)
    # vllm: this test is about vLLM's own app (seconds to import)
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from server.intake.event_plugin import ClaimPrograms

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--api-key", A, B, "--middleware",
         "server.intake.agentic_context.AgenticContextMiddleware"])
    app = build_app(args, supported_tasks=("generate",))
    names = [m.cls.__name__ for m in app.user_middleware]  # outermost first
    assert names.index("AuthenticationMiddleware") < names.index(ClaimPrograms.__name__)
    assert names.index("AgenticContextMiddleware") < names.index(ClaimPrograms.__name__)
    client = TestClient(app)  # no lifespan: vLLM's needs an engine
    event = {"type": "program_start", "program_id": "p"}
    assert client.post(ROUTE, json=event).status_code == 401
    assert client.post(ROUTE, json=event, headers=bearer(A)).json()["accepted"] == 1
    assert client.post(ROUTE, json=event, headers=bearer(B)).status_code == 403


# -- the cluster router --------------------------------------------------------------------------

def test_router_refuses_another_tenants_events_and_hides_tenant_keys_from_replicas():
    app, replicas = router_app(tenants=[A, B], api_key=CLUSTER)
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body("pa"),
                           headers=bearer(A)).status_code == 200
        refused = client.post(ROUTE, headers=bearer(B), json={"type": "program_end",
                                                               "program_id": "pa"})
        assert refused.status_code == 403
        assert refused.json()["error"].startswith("event 1: program 'pa' was opened with "
                                                  "another API key")
        assert client.post(ROUTE, headers=bearer(A), json={
            "type": "tool_start", "program_id": "pa", "tool": "bash"}).status_code == 200
        # B opens its own program by an event; A may not end it
        assert client.post(ROUTE, headers=bearer(B), json={
            "type": "program_start", "program_id": "pb"}).status_code == 200
        assert client.post(ROUTE, headers=bearer(A), json={
            "type": "program_end", "program_id": "pb"}).status_code == 403
        # the cluster's own key is one more tenant
        assert client.post(ROUTE, headers=bearer(CLUSTER), json={
            "type": "tool_end", "program_id": "pa"}).status_code == 403
        counters = client.get("/v1/cluster", headers=bearer(A)).json()["counters"]
        stats = client.get(ROUTE, headers=bearer(B)).json()
    assert counters["events_refused_not_owner"] == 3
    assert stats["refused"] == {"invalid": 0, "too_large": 0, "not_owner": 3}
    assert stats["owners"]["programs"] == 2
    # the replicas saw the cluster's key only, and none of the refused events
    assert {auth for _, auth, _ in replicas.seen} == {f"Bearer {CLUSTER}"}
    assert [body for _, body in replicas.events()] == [
        b'{"type": "tool_start", "program_id": "pa", "tool": "bash"}']  # pb: no turn, no home


def test_router_refuses_a_turn_of_another_tenants_program():
    # a turn would move, pin or end the program as an event would: only its key may send one
    app, replicas = router_app(tenants=[A, B], api_key=CLUSTER, strategy="programs")
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body("pa"),
                           headers=bearer(A)).status_code == 200
        refused = client.post("/v1/chat/completions", json=chat_body("pa"), headers=bearer(B))
        assert refused.status_code == 403
        assert "program 'pa' was opened with another API key" in refused.json()["error"][
            "message"]
        assert client.post("/v1/completions", headers={**bearer(B), "X-Session-ID": "pa"},
                           json={"model": "m", "prompt": "hi"}).status_code == 403
        assert client.post("/v1/chat/completions", json=chat_body("pa"),
                           headers=bearer(A)).status_code == 200
        counters = client.get("/v1/cluster", headers=bearer(A)).json()["counters"]
    assert counters["requests_refused_not_owner"] == 2
    assert len(replicas.seen) == 2  # the refused turns reached no replica


def test_router_tenants_without_a_cluster_key_send_replicas_no_key():
    app, replicas = router_app(tenants=[A, B])
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body("p"),
                           headers=bearer(B)).status_code == 200
        assert client.post("/v1/chat/completions", json=chat_body("p"),
                           headers=bearer("nope")).status_code == 401
    assert [auth for _, auth, _ in replicas.seen] == [None]


def test_router_with_one_key_is_one_tenant():
    app, replicas = router_app(api_key=A)
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=chat_body("p"),
                           headers=bearer(A)).status_code == 200
        assert client.post(ROUTE, headers=bearer(A), json={
            "type": "program_end", "program_id": "p"}).status_code == 200
        assert client.get(ROUTE, headers=bearer(A)).json()["owners"] is None
    assert {auth for _, auth, _ in replicas.seen} == {f"Bearer {A}"}  # passed on as it came


@pytest.mark.server
@pytest.mark.slow
def test_a_real_engine_with_two_keys_keeps_each_tenants_programs():
    """`harness serve -- --api-key A B` (vLLM's own list of keys): A's chat request opens its
    program; B's `program_end` for it gets a 403 and is counted in `/metrics`; A's is taken."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from harness.server_process import ServerProcess

    with ServerProcess(policy="continuum", vllm_args=["--api-key", A, B]) as server:
        url = server.base_url
        answer = httpx.post(url + "/v1/chat/completions", headers=bearer(A), timeout=60, json={
            **chat_body("pa"), "model": "llama-3.1-8b", "max_tokens": 2})
        assert answer.status_code == 200, answer.text
        end = {"type": "program_end", "program_id": "pa"}
        refused = httpx.post(url + ROUTE, headers=bearer(B), json=end)
        assert refused.status_code == 403 and "'pa'" in refused.json()["error"]
        assert httpx.post(url + ROUTE, json=end).status_code == 401
        taken = httpx.post(url + ROUTE, headers=bearer(A), json=end)
        assert taken.status_code == 200 and taken.json()["accepted"] == 1
        samples = {(s.name, s.labels.get("reason")): s.value for family in
                   text_string_to_metric_families(httpx.get(url + "/metrics").text)
                   for s in family.samples if s.name.startswith("harness:agent_event")}
        stats = httpx.get(url + ROUTE, headers=bearer(B)).json()
    assert samples[("harness:agent_event_requests_refused_total", "not_owner")] == 1
    assert stats["refused"]["not_owner"] == 1 and stats["owners"]["ended"] == 1
