"""`harness cluster serve`'s launcher without real replicas: each replica's command line
(ports, blocks, the NIXL connector of a cluster that carries KV) and fake replica processes (a
failed replica stops the others; a SIGKILLed launcher leaves no process behind).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cluster_helpers import cluster_file

from cluster.config import ClusterConfigError, load_cluster, parse_cluster
from cluster.launcher import (
    Launcher,
    LauncherError,
    group_members,
    replica_command,
    replica_ports,
)
from common.processes import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_replica_commands_are_separate(tmp_path):
    config = load_cluster(ROOT / "cluster" / "examples" / "colocated-2-tiny.yaml")
    ports = replica_ports(config, 8200)
    assert ports == {"d0": 8200, "d1": 8201}
    (argv0, env0), (argv1, env1) = (replica_command(config, s, ports[s.name])
                                    for s in config.replicas)
    assert argv0[argv0.index("--port") + 1] == "8200"
    assert argv0[argv0.index("--num-gpu-blocks-override") + 1] == "512"
    # what 511 blocks of 16 tokens hold (vLLM's null block is the 512th), below 32768
    assert argv0[argv0.index("--max-model-len") + 1] == "8176"
    assert env0["HARNESS_EVENTS_IPC"] != env1["HARNESS_EVENTS_IPC"]
    clash = parse_cluster({"replicas": [{"name": "a", "port": 8301}, {"name": "b"}]})
    with pytest.raises(LauncherError, match="both use port 8301"):
        replica_ports(clash, 8300)


def test_a_cluster_that_carries_kv_gives_every_colocated_replica_the_nixl_connector():
    """`carry_kv` (the `programs` router moves programs with their KV): each colocated
    replica sends and reads KV (`kv_both`) and advertises its own side channel; without it,
    no connector. A replica that also keeps a CPU tier runs both connectors, stacked."""
    data = {"router": {"strategy": "programs", "carry_kv": True},
            "replicas": [{"name": "r", "count": 2, "policy": "lookahead"}]}
    config = parse_cluster(data)
    argv, env = replica_command(config, config.replicas[0], 8200, side_channel_port=9300)
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_both" and kv["engine_id"] == "r0"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "9300"
    plain = parse_cluster({**data, "router": {"strategy": "programs"}})
    assert "--kv-transfer-config" not in replica_command(plain, plain.replicas[0], 8200)[0]
    tier = parse_cluster({**data, "replicas": [{"name": "r", "count": 2, "policy": "mori"}]})
    argv, _ = replica_command(tier, tier.replicas[1], 8200, side_channel_port=9301)
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert (kv["kv_connector"], kv["engine_id"]) == ("MultiConnector", "r1")
    assert [c["kv_connector"] for c in kv["kv_connector_extra_config"]["connectors"]] == [
        "NixlConnector", "OffloadingConnector"]
    with pytest.raises(ClusterConfigError, match="carry_kv"):
        parse_cluster({**data, "router": {"strategy": "session", "carry_kv": True}})



FAKE_REPLICA = textwrap.dedent("""\
    import http.server, os, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # stubborn: only SIGKILL ends it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """)


@pytest.mark.server
def test_failed_replica_stops_the_others_and_shows_its_log(tmp_path):
    config = load_cluster(cluster_file(tmp_path, [{"name": "good"}, {"name": "bad"}]))
    base = free_port()
    lines: list[str] = []
    launcher = Launcher(config, base_port=base, log_dir=tmp_path / "logs", out=lines.append)
    good, bad = launcher.replicas
    good.argv = [sys.executable, "-c", "import time; time.sleep(600)"]
    bad.argv = [sys.executable, "-c", "import sys, time; time.sleep(0.5); "
                "print('no KV cache for you'); sys.exit(3)"]
    with pytest.raises(LauncherError) as failure:
        launcher.start()
    assert "replica bad exited with code 3" in str(failure.value)
    assert "no KV cache for you" in str(failure.value)
    assert good.process is not None and good.process.poll() is not None  # stopped
    assert any("bad: colocated" in line for line in lines)


@pytest.mark.server
def test_sigkilled_launcher_leaves_no_process(tmp_path):
    """PR_SET_PDEATHSIG plus the reaper: stubborn fake replicas and their children go too."""
    script = tmp_path / "launch.py"
    file = str(cluster_file(tmp_path, [{"name": "a"}, {"name": "b"}]))
    logs = str(tmp_path / "logs")
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        from cluster.config import load_cluster
        from cluster.launcher import Launcher
        launcher = Launcher(load_cluster({file!r}), base_port={free_port()}, log_dir={logs!r},
                            reap_grace_s=1.0)
        for r in launcher.replicas:
            r.argv = [sys.executable, "-c", {FAKE_REPLICA!r}, str(r.port)]
        launcher.start()
        print("PIDS", *[r.pid for r in launcher.replicas], flush=True)
        time.sleep(600)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, start_new_session=True)
    try:
        line = ""
        while not line.startswith("PIDS"):
            line = proc.stdout.readline()
            assert line, "the launcher ended before its replicas were up"
        groups = [int(p) for p in line.split()[1:]]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(len(group_members(g)) for g in groups) < 4:
            time.sleep(0.1)
        assert sum(len(group_members(g)) for g in groups) == 4  # replicas + their children
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(group_members(g) for g in groups):
            time.sleep(0.2)
        assert not any(group_members(g) for g in groups)
    finally:
        if proc.poll() is None:
            proc.kill()
