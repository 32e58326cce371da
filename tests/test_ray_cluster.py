"""`harness cluster serve --address` on a two-node Ray cluster on this machine.

One Ray cluster for the module (`ray.cluster_utils.Cluster`: a head with the custom resource
`node_a`, a second node with `node_b`, 2 logical CPUs each, so four replicas asking 1 CPU each
land two per node). On it, one served cluster at a time, started as a user would, through the
command line: a 4-replica colocated cluster (emulated GPU, 512 KV blocks each, `session`
routing, the `preserve` policy: each turn's KV is pinned until the program's next turn or its
`program_end`) for a real `harness run`, then a replica killed under a run; a third node
that is lost under a run and replaced; a 1P1D cluster for the P/D hand-off, over HTTP and
through Serve (`--transport`). What the tests read: the router's
`GET /v1/cluster` (nodes, counters, restarts, each replica's gauges) and each engine's own
endpoints on its node's address (`engine_url`: its events, its Prometheus `/metrics`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_helpers import nixl_bytes, pd_turn
from subprocess_helpers import finish

from cluster.router_state import engine_gauges
from common.processes import free_port

pytestmark = [pytest.mark.server, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b"
#: Serve's HTTP port is the Ray cluster's (its first `serve.start`): one for the module.
PORT = free_port()


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[Any]:
    # ray: start-up cost (~2 s), paid only by this module's tests
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:  # for this module's nodes, restored after it
        # this machine is shared: Ray's memory monitor would kill Serve's actors when another
        # process fills the memory (it looks at the whole machine's use)
        if "RAY_memory_monitor_refresh_ms" not in os.environ:
            env.setenv("RAY_memory_monitor_refresh_ms", "0")
        # Serve runs an HTTP proxy on every node, each binding the same port with
        # SO_REUSEPORT: on one machine the kernel spreads the tests' connections over all of
        # them, and one on a node the test kills resets them or, dying, holds them
        # unanswered. The other nodes' proxies take a port of their own (Serve's knob for
        # proxies that share a machine), so the tests speak to the head node's, as a user on
        # the head would. Nodes added later by the tests inherit it too.
        env.setenv("RAY_SERVE_WORKER_PROXY_HTTP_PORT", str(free_port()))
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 2, "resources": {"node_a": 1}, "include_dashboard": False})
        cluster.add_node(num_cpus=2, resources={"node_b": 1})
        yield cluster
        cluster.shutdown()


class RayServed:
    """`python -m cli cluster serve FILE --address ADDR` in a subprocess (its own session)."""

    def __init__(self, tmp: Path, address: str, name: str, strategy: str,
                 replicas: list[dict[str, Any]], *args: str) -> None:
        self.file = tmp / f"{name}.json"
        self.file.write_text(json.dumps({"name": name, "router": {"strategy": strategy},
                                         "replicas": replicas}))
        self.url = f"http://127.0.0.1:{PORT}"
        self.out = tmp / f"{name}.out"
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli", "cluster", "serve", str(self.file), "--address",
             address, "--port", str(PORT), "--log-dir", str(tmp / f"{name}-logs"), *args],
            stdout=self.out.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)

    def wait_ready(self, timeout_s: float = 900.0) -> RayServed:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"`harness cluster serve` exited with {self.process.returncode}:\n"
                            f"{self.out.read_text()}")
            try:
                if all(r["alive"] for r in self.state()["replicas"]):
                    self.ready_s = time.monotonic() - self.started
                    return self
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(2)
        self.stop()
        pytest.fail(f"the cluster did not come up in {timeout_s:.0f} s:\n{self.out.read_text()}")

    def state(self) -> dict[str, Any]:
        return httpx.get(self.url + "/v1/cluster", timeout=10).json()

    def replicas(self) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.state()["replicas"]}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def received(served: RayServed) -> dict[str, int]:
    """Events each replica's engine received (its own `GET /v1/agent/events`)."""
    return {name: httpx.get(r["engine_url"] + "/v1/agent/events", timeout=10).json()["received"]
            for name, r in served.replicas().items()}


def gauges(served: RayServed) -> dict[str, dict[str, float]]:
    """Each replica's engine metrics as the router reads them (`engine_gauges`), after one
    tiny request per engine: the scheduler takes agent events in at its next step, and an
    engine left idle after the run has not taken the last `program_end`s in yet."""
    out = {}
    for name, r in served.replicas().items():
        model = httpx.get(r["engine_url"] + "/v1/models", timeout=10).json()["data"][0]["id"]
        httpx.post(r["engine_url"] + "/v1/completions", timeout=60,
                   json={"model": model, "prompt": [1, 2, 3], "max_tokens": 1}
                   ).raise_for_status()
        out[name] = engine_gauges(httpx.get(r["engine_url"] + "/metrics", timeout=10).text)
    return out


def harness_run(served: RayServed, out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cli", "run", "gsm8k", "--server", served.url, "--out", str(out),
         *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def results(out: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}


def busy_replica(served: RayServed, run: subprocess.Popen[str]) -> dict[str, Any]:
    """The replica with the most turns in flight, as soon as one has any."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and run.poll() is None:
        busy = sorted((r for r in served.replicas().values() if r["in_flight"] > 0),
                      key=lambda r: -r["in_flight"])
        if busy:
            return busy[0]
        time.sleep(0.05)
    pytest.fail("no replica was ever busy")


@pytest.fixture(scope="class")
def colocated(ray_nodes, tmp_path_factory) -> Iterator[RayServed]:
    spec = {"role": "colocated", "policy": "preserve", "num_gpu_blocks": 512}
    served = RayServed(tmp_path_factory.mktemp("ray-colocated"), ray_nodes.address, "four",
                       "session", [{"name": f"c{i}", **spec} for i in range(4)]).wait_ready()
    print(f"4 replicas on Ray ready after {served.ready_s:.0f} s")
    yield served
    served.stop()


class TestColocated:
    def test_session_run_keeps_each_program_on_one_replica(self, colocated, tmp_path):
        """A `harness run` through the Ray cluster: the replicas run on both nodes; each
        program's turns stay on its replica (no rebind, and each event reached exactly one
        replica: a program on two would have its `program_end` sent to both); its later turns
        hit that replica's prefix cache; and its replica's metrics show its pins: one per turn
        (`preserve`), every one released, by the program's next turn or by the `program_end`
        that reached that replica (a pin left anywhere would mean an event went astray)."""
        replicas = colocated.replicas()
        assert len({r["node"] for r in replicas.values()}) == 2, replicas
        before, counted = received(colocated), colocated.state()["counters"]
        metrics_before = gauges(colocated)
        out = tmp_path / "run"
        run = harness_run(colocated, out, "--limit", "8", "--concurrency", "4")
        output = finish(run, 600)
        assert run.returncode == 0, output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["tasks"] == 8 and summary["retryable"] == 0
        gained = {n: a - before[n] for n, a in received(colocated).items()}
        counters = {k: v - counted[k] for k, v in colocated.state()["counters"].items()
                    if isinstance(v, int) and isinstance(counted.get(k), int)}
        assert counters["rebinds"] == 0 and counters["failed"] == 0, counters
        assert counters["events_dropped"] == 0 and counters["programs_ended"] >= 1, counters
        # every event the router received reached exactly one replica (a program_start that
        # came before the program's first turn was kept and delivered with that turn)
        assert sum(gained.values()) == counters["events_received"] > 4, (gained, counters)
        assert sum(1 for g in gained.values() if g) >= 2  # programs spread over replicas
        later = [s for p in out.rglob("*.traj.json")
                 for s in json.loads(p.read_text())["steps"][1:]]
        assert later and all(s["cached_tokens"] > 0 for s in later), later
        metrics = gauges(colocated)
        pins = {n: m["pins"] - metrics_before[n]["pins"] for n, m in metrics.items()}
        taken = {n: m["events_taken"] - metrics_before[n]["events_taken"]
                 for n, m in metrics.items()}
        assert taken == gained, (taken, gained)  # each engine's scheduler took its events in
        assert sum(pins.values()) >= len(later) and all(  # a pin where events went, only
            (pins[n] > 0) == (gained[n] > 0) for n in pins), (pins, gained)
        left = {n: httpx.get(r["engine_url"] + "/v1/agent/events", timeout=10).json()
                for n, r in colocated.replicas().items() if metrics[n]["pinned_now"]}
        assert not left, (left, [p.name for p in out.rglob("*.traj.json")])
        # the router's view of each replica carries the same gauges (Serve's routing stats)
        deadline = time.monotonic() + 30
        while any(r.get("pins") != metrics[n]["pins"] for n, r in colocated.replicas().items()):
            assert time.monotonic() < deadline, (colocated.replicas(), metrics)
            time.sleep(1)

    def test_a_killed_replica_is_restarted_and_resume_grades_each_task_once(self, colocated,
                                                                            tmp_path):
        """SIGKILL one replica's actor under a run whose model calls are not retried: a
        program with a turn in flight there ends retryable (as for a dead server) and no new
        program starts, then `harness run --resume` finishes the run; the router sends nothing
        more to the dead replica and rebinds its programs; Ray starts it again (same name);
        every task is graded exactly once. Whether a turn is in flight at the kill is timing
        (turns take a fraction of a second here); `TestNodeLost` always has one."""
        out = tmp_path / "run"
        run = harness_run(colocated, out, "--concurrency", "4", "--model-retries", "0")
        victim = busy_replica(colocated, run)
        os.kill(victim["actor_pid"], signal.SIGKILL)
        output = finish(run, 600)
        first = results(out)
        finished = {n for n, r in first.items() if not r.get("retryable")}
        stamps = {n: (out / "results" / f"{n}.json").stat().st_mtime_ns for n in finished}
        print(f"killed {victim['name']}: the run ended with {run.returncode}, "
              f"{len(first) - len(finished)} program(s) to resume")
        if run.returncode != 0:  # a turn was in flight there (TestNodeLost always has one)
            assert "--resume" in output and len(finished) < len(first), output
            rest = harness_run(colocated, out, "--resume", "--concurrency", "4")
            output = finish(rest, 600)
            assert rest.returncode == 0, output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["tasks"] == 10 and summary["retryable"] == 0, summary
        assert len(results(out)) == 10
        assert {n: (out / "results" / f"{n}.json").stat().st_mtime_ns
                for n in finished} == stamps  # nothing graded twice
        state = colocated.state()
        assert state["counters"]["rebinds"] >= 1 or state["counters"]["failed"] >= 1
        deadline = time.monotonic() + 600  # Ray starts the replica again
        again: dict[str, Any] = {"alive": False, "restarts": 0}
        while not (again["alive"] and again["restarts"] >= 1) and time.monotonic() < deadline:
            time.sleep(2)
            try:
                again = colocated.replicas()[victim["name"]]
            except httpx.HTTPError:  # a slow answer on a loaded machine: ask again
                continue
        assert again["alive"] and again["restarts"] >= 1, again
        assert again["actor_pid"] != victim["actor_pid"]


class TestNodeLost:
    def test_a_lost_node_is_named_and_resume_finishes_on_its_successor(self, ray_nodes,
                                                                       tmp_path):
        """Both replicas of a cluster ask for the custom resource only node C has (the router
        reaching their engines over HTTP, `--transport http`); node C is
        lost (its Ray processes killed, no goodbye) under a run whose model calls are not
        retried: the run ends its programs retryable and the router names the node; once a
        new node with the resource joins, Ray places the replicas there and `harness run
        --resume` finishes, every task graded once."""
        node_c = ray_nodes.add_node(num_cpus=2, resources={"node_c": 2})
        served = RayServed(tmp_path, ray_nodes.address, "lost", "session",
                           [{"name": f"n{i}", "policy": "vllm", "num_gpu_blocks": 256}
                            for i in range(2)],
                           "--replica-resources", '{"node_c": 1}', "--transport", "http"
                           ).wait_ready()
        try:
            assert {r["node"] for r in served.replicas().values()} == {node_c.node_id}
            out = tmp_path / "run"
            run = harness_run(served, out, "--limit", "6", "--concurrency", "4",
                              "--model-retries", "0")
            busy_replica(served, run)
            ray_nodes.remove_node(node_c, allow_graceful=False)
            output = finish(run, 600)
            assert run.returncode != 0 and "--resume" in output, output
            first = results(out)
            finished = {n for n, r in first.items() if not r.get("retryable")}
            stamps = {n: (out / "results" / f"{n}.json").stat().st_mtime_ns for n in finished}
            assert len(finished) < 6
            deadline = time.monotonic() + 120  # the GCS declares the node dead
            while not all(node_c.node_id in (r["last_error"] or "")
                          for r in served.replicas().values()):
                assert time.monotonic() < deadline, json.dumps(served.replicas(), indent=1)
                time.sleep(1)
            answer = httpx.post(served.url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert answer.status_code == 503 and node_c.node_id in answer.text, answer.text

            successor = ray_nodes.add_node(num_cpus=2, resources={"node_c": 2})
            served.wait_ready()
            replicas = served.replicas()
            assert {r["node"] for r in replicas.values()} == {successor.node_id}, replicas
            assert all(r["restarts"] >= 1 for r in replicas.values()), replicas
            rest = harness_run(served, out, "--resume", "--limit", "6", "--concurrency", "4")
            output = finish(rest, 600)
            assert rest.returncode == 0, output
            summary = json.loads((out / "summary.json").read_text())
            assert summary["tasks"] == 6 and summary["retryable"] == 0, summary
            assert {n: (out / "results" / f"{n}.json").stat().st_mtime_ns
                    for n in finished} == stamps  # nothing graded twice
        finally:
            served.stop()


@pytest.fixture(scope="class", params=["serve", "http"])
def pd_cluster(request, ray_nodes, tmp_path_factory) -> Iterator[RayServed]:
    """1P1D, the router reaching the engines through Serve, then over HTTP (`--transport`)."""
    spec = {"profile": "h100-llama-3.1-8b", "policy": "vllm", "num_gpu_blocks": 64}
    served = RayServed(tmp_path_factory.mktemp("ray-pd"), ray_nodes.address, "pd", "pd",
                       [{"name": "p", "role": "prefill", **spec},
                        {"name": "d", "role": "decode", **spec}],
                       "--transport", request.param).wait_ready()
    yield served
    served.stop()


class TestPD:
    def test_second_turn_pulls_only_its_new_blocks(self, pd_cluster):
        """tests/test_cluster_served.py's two-turn P/D program, on Ray: turn 1 prefills 64
        tokens on P and D pulls its 4 blocks (4 x 16 tokens x 131,072 bytes); turn 2 (192
        tokens) pulls only the last 4 of P's 12 blocks."""
        c = pd_cluster
        d_url = c.replicas()["d"]["engine_url"]

        prompt1 = list(range(100, 164))
        _, answer1 = pd_turn(c.url, MODEL, prompt1, 0, 80)
        assert nixl_bytes(d_url) == (4 * 16 * 131_072, 1)
        prompt2 = prompt1 + answer1 + list(range(300, 348))
        reply2, _ = pd_turn(c.url, MODEL, prompt2, 1, 5)
        assert reply2.json()["usage"]["prompt_tokens"] == 192
        assert nixl_bytes(d_url) == (2 * 4 * 16 * 131_072, 2)
        assert c.state()["counters"]["pd_prefills"] == 2
