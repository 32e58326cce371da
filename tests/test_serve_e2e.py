"""`harness serve` end to end: the real vLLM OpenAI server, our scheduler, the emulated GPU.

Driven with the `openai` package as a user would. Each server takes ~40 s to start on these
2-core machines, so one server per policy serves all tests of that policy.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from harness.server_process import ServerProcess

pytestmark = [pytest.mark.server, pytest.mark.slow]  # each starts `harness serve`: ~20 s
MODEL = "llama-3.1-8b"
PARAGRAPH = ("The repository keeps its parser in a single module, and the failing test shows "
             "that nested brackets are closed in the wrong order when a quote appears inside. ")


@pytest.fixture(scope="module")
def continuum_server():
    with ServerProcess(policy="continuum") as server:
        yield server


@pytest.fixture(scope="module")
def vllm_small_cache_server():
    # 96 blocks of 16 tokens: a few thousand tokens of other traffic evict everything unpinned
    with ServerProcess(policy="vllm", serve_args=["--max-model-len", "1024"],
                       vllm_args=["--num-gpu-blocks-override", "96"]) as server:
        yield server


def chat(server: ServerProcess, messages: list[dict], program: str, turn: int,
         max_tokens: int = 16, **xargs):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens,
        extra_body={"session_id": program, "vllm_xargs": {"turn": turn, **xargs}})


def two_turns(server: ServerProcess, program: str, filler: int = 0):
    first = [{"role": "system", "content": "You are a careful software engineer."},
             {"role": "user", "content": PARAGRAPH * 12 + f" Program {program}."}]
    r1 = chat(server, first, program, 0, tool="bash")
    for i in range(filler):  # other programs' traffic between the two turns
        chat(server, [{"role": "user", "content": f"{i} unrelated request. " + PARAGRAPH * 14}],
             f"filler-{program}-{i}", 0)
    second = first + [{"role": "assistant", "content": "Thought: run the tests.\n"},
                      {"role": "user", "content": "Observation: 3 passed, 1 failed."}]
    r2 = chat(server, second, program, 1)
    return r1, r2


def cached(response) -> int:
    details = response.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details else 0


def test_second_turn_reuses_first_turn_context(continuum_server):
    r1, r2 = two_turns(continuum_server, "prog-c")
    assert r1.usage.prompt_tokens > 300
    # the first turn's whole prompt, to the last full 16-token block, comes from the cache
    assert cached(r2) >= r1.usage.prompt_tokens // 16 * 16


def test_pins_show_in_the_servers_metrics(continuum_server):
    """A turn ending in a tool call pins its program's KV; the server's own endpoints show it:
    `GET /v1/agent/events` (the scheduler's counters) and Prometheus `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    def metrics() -> dict[str, float]:
        text = httpx.get(continuum_server.base_url + "/metrics").text
        return {f"{s.name}{s.labels or ''}": s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples if s.name.startswith("harness:")}

    before = metrics().get("harness:pins_total", 0.0)
    # a predicted 0.1 ms tool call: far cheaper to wait for than to prefill 400 tokens again
    chat(continuum_server, [{"role": "user", "content": PARAGRAPH * 12}], "prog-m", 0,
         tool="bash", predicted_s=1e-4)
    status = httpx.get(continuum_server.base_url + "/v1/agent/events").json()["scheduler"]
    assert status["pins"]["pinned"] >= 1, status
    after = metrics()
    assert after["harness:pins_total"] == before + 1, after
    assert "harness:pinned_programs" in after, after
    assert "harness:pins_released_total{'reason': 'handoff'}" in after, after


def test_without_retention_pressure_evicts_the_context(vllm_small_cache_server):
    r1, r2 = two_turns(vllm_small_cache_server, "prog-v", filler=6)
    assert r1.usage.prompt_tokens > 300
    # evicted: the policy `vllm` reached the engine-core process in vLLM's config
    # (`--additional-config`); the default an engine without settings takes (continuum) pins
    assert cached(r2) < r1.usage.prompt_tokens // 2


def test_replayed_text_comes_back_verbatim(continuum_server):
    text = "Thought: list the files.\n```bash\nls -la /testbed\n```"
    r = chat(continuum_server, [{"role": "user", "content": "go"}], "prog-r", 0,
             max_tokens=200, emulate_text=text)
    assert r.choices[0].message.content == text
    assert r.choices[0].finish_reason == "stop"


def test_events_endpoint_validates(continuum_server):
    url = continuum_server.base_url + "/v1/agent/events"
    ok = httpx.post(url, content=b'{"type":"tool_start","program_id":"nobody","tool":"bash",'
                    b'"predicted_s":1.5}\n{"type":"tool_end","program_id":"nobody",'
                    b'"seconds":1.2,"return_tokens":40}')
    assert ok.status_code == 200 and ok.json()["accepted"] == 2
    bad = httpx.post(url, json={"type": "tool_start", "program_id": "p", "predicted_s": -1})
    assert bad.status_code == 400 and "predicted_s" in bad.json()["error"]
    typo = httpx.post(url, json={"type": "tool_stop", "program_id": "p"})
    assert typo.status_code == 400 and "type" in typo.json()["error"]


def test_prefetch_policy_serves_over_http_while_traffic_evicts():
    """Served `continuum-prefetch` (the real OpenAI server, host tier on): other programs'
    traffic evicts program A's context during its predicted 2 s tool call, the scheduler starts
    a prefetch request nobody submitted, and the server's output path must ignore it; A's next
    turn then finds its whole context (prefetched and pinned, or loaded on arrival: which one
    is not visible over HTTP; `tests/test_prefetch.py` tells them apart in virtual time)."""
    import threading
    import time

    with ServerProcess(policy="continuum-prefetch", serve_args=["--max-model-len", "1024"],
                       vllm_args=["--num-gpu-blocks-override", "96"]) as server:
        first = [{"role": "system", "content": "You are a careful software engineer."},
                 {"role": "user", "content": PARAGRAPH * 12 + " Program prog-p."}]
        r1 = chat(server, first, "prog-p", 0, tool="bash", predicted_s=2.0)
        stop = threading.Event()

        def traffic(k: int) -> None:  # other programs, back to back, until A returns
            i = 0
            while not stop.is_set():
                chat(server, [{"role": "user", "content": f"{k} {i} other. " + PARAGRAPH * 14}],
                     f"filler-{k}-{i}", 0)
                i += 1

        threads = [threading.Thread(target=traffic, args=(k,)) for k in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(2.0)  # the tool call, as predicted
        second = first + [{"role": "assistant", "content": "Thought: run the tests.\n"},
                          {"role": "user", "content": "Observation: 3 passed, 1 failed."}]
        r2 = chat(server, second, "prog-p", 1, last=1)
        stop.set()
        for thread in threads:
            thread.join()
    assert r1.usage.prompt_tokens > 300
    assert cached(r2) >= r1.usage.prompt_tokens // 16 * 16
