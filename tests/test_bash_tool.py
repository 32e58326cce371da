"""The bash tool against the real Docker engine: results, isolation, limits, cleanup.

Every test uses the ``docker_client`` fixture, so without an engine they skip, and
under HARNESS_REQUIRE_DOCKER=1 they fail.  Cheap checks share one tool (one
container); the destructive ones (fork bomb, memory hog, stopped wrapper) get their
own.  All containers carry a per-module owner label; the last check is that none of
them is left behind.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.tools import bash as bt
from harness.tools import bash_container as bc
from harness.tools import labels as lb
from harness.tools import sandbox_image as si

pytestmark = pytest.mark.docker

IMAGE = os.environ.get("HARNESS_SANDBOX_IMAGE", si.DEFAULT_IMAGE)
OWNER = f"pytest-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make_tool(client: Any, program_id: str | None = None, **limits: Any) -> bt.BashTool:
    """A tool in this session's image and owner; `limits`: `bt.CommandLimits` fields."""
    return bt.BashTool(program_id, client=client,
                       container=bc.ContainerSpec(image=IMAGE, owner=OWNER),
                       commands=bt.CommandLimits(**limits))


@pytest.fixture(scope="module")
def image(docker_client: Any) -> Iterator[str]:
    """The sandbox image (built offline if missing); at the end, no container may be left."""
    try:
        si.build_offline_image(IMAGE, client=docker_client, progress=lambda _m: None)
    except si.SandboxImageError as exc:
        if os.environ.get("HARNESS_REQUIRE_DOCKER") == "1":
            pytest.fail(f"cannot build sandbox image: {exc}", pytrace=False)
        pytest.skip(f"cannot build sandbox image: {exc}")
    yield IMAGE
    left = docker_client.containers.list(all=True, filters={"label": [f"{lb.OWNER_LABEL}={OWNER}"]})
    bc.remove_leftovers(docker_client, owner=OWNER)
    assert not left, f"containers left behind: {[c.name for c in left]}"


@pytest.fixture(scope="module")
def tool(docker_client: Any, image: str) -> Iterator[bt.BashTool]:
    """One tool shared by the cheap tests."""
    t = make_tool(docker_client, program_id="shared", timeout=20)
    run(t.start())
    yield t
    run(t.aclose())


def body(text: str) -> str:
    """The output part of an observation text."""
    return text.split("<output>\n", 1)[1].rsplit("</output>", 1)[0]


def test_echo_and_exit_codes(tool: bt.BashTool) -> None:
    obs = run(tool.run("echo hello; echo oops >&2"))
    assert obs.ok and obs.info["exit_code"] == 0 and not obs.info["timed_out"]
    assert obs.text.startswith("<returncode>0</returncode>")
    assert body(obs.text) == "hello\noops\n"  # stderr joins stdout, in order
    obs = run(tool.run("echo partial; exit 3"))
    assert not obs.ok and obs.info["exit_code"] == 3
    assert "<returncode>3</returncode>" in obs.text and "partial" in obs.text
    obs = run(tool.run("no-such-command-xyz"))
    assert obs.info["exit_code"] == 127 and "not found" in obs.text
    assert not run(tool.run("   ")).ok  # an empty command is an error observation
    assert body(run(tool.run("cat; echo eof")).text) == "eof\n"  # stdin is empty, not open


def test_files_persist_but_cd_and_env_do_not(tool: bt.BashTool) -> None:
    obs = run(tool.run("mkdir -p sub && cd sub && echo data > f.txt && export FOO=bar && pwd"))
    assert body(obs.text) == "/testbed/sub\n"
    obs = run(tool.run('pwd; cat sub/f.txt; echo "FOO=${FOO:-unset}"'))
    assert body(obs.text) == "/testbed\ndata\nFOO=unset\n"
    assert body(run(tool.run("echo $PAGER $LANG")).text) == "cat C.UTF-8\n"


def test_runs_as_agent_with_limits(tool: bt.BashTool, docker_client: Any) -> None:
    assert body(run(tool.run("id -u; id -un; whoami")).text) == "1000\nagent\nagent\n"
    obs = run(tool.run("touch /etc/x"))
    assert not obs.ok and "Permission denied" in obs.text
    attrs = docker_client.containers.get(tool.container_id).attrs
    host = attrs["HostConfig"]
    assert host["NetworkMode"] == "none" and host["Init"] is True
    assert host["Memory"] == host["MemorySwap"] == 1024**3
    assert host["PidsLimit"] == bc.DEFAULT_PIDS_LIMIT and host["NanoCpus"] == 10**9
    assert "no-new-privileges" in host["SecurityOpt"]
    labels = attrs["Config"]["Labels"]
    assert labels[lb.PROGRAM_LABEL] == "shared" and labels[lb.OWNER_LABEL] == OWNER


def test_no_network(tool: bt.BashTool) -> None:
    assert body(run(tool.run("ls /sys/class/net")).text).split() == ["lo"]
    obs = run(
        tool.run(
            "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=3)'"
        )
    )
    assert not obs.ok and ("unreachable" in obs.text or "OSError" in obs.text)


def test_timeout_kills_the_command(tool: bt.BashTool) -> None:
    t0 = time.monotonic()
    obs = run(tool.run("echo started; sleep 100", timeout=2))
    took = time.monotonic() - t0
    assert took < 2 + 2.5, took
    assert not obs.ok and obs.info["timed_out"]
    assert "killed after 2 s" in obs.text and "started" in obs.text
    obs = run(tool.run("pgrep -u agent -x sleep || echo none"))
    assert body(obs.text) == "none\n"  # the sleep died with its process group
    assert run(tool.run("true")).ok


def test_output_truncated_head_and_tail(tool: bt.BashTool) -> None:
    cmd = "python3 -c \"print('a'*6000 + 'b'*10000 + 'c'*6000, end='')\""
    obs = run(tool.run(cmd))
    assert obs.ok and obs.info["truncated"] and obs.info["elided_chars"] == 12000
    out = body(obs.text)
    head, rest = out.split("\n[... 12000 characters elided", 1)
    assert head == "a" * 5000
    assert rest.endswith("...]\n" + "c" * 5000)
    obs = run(tool.run("python3 -c \"print('x'*9000)\""))
    assert not obs.info["truncated"] and "elided" not in obs.text


def test_huge_output_is_bounded(tool: bt.BashTool) -> None:
    obs = run(tool.run("yes 'héllo' | head -n 2000000; echo END"))  # 14 MB, 12M characters
    assert obs.ok and obs.info["truncated"]
    assert obs.info["elided_chars"] == 2000000 * 6 + 4 - 10000
    assert body(obs.text).startswith("héllo\n") and body(obs.text).endswith("héllo\nEND\n")
    assert len(obs.text) < 11000


def test_output_read_with_the_headers_is_kept(tool: bt.BashTool) -> None:
    """Output that arrives before the client parses the HTTP headers (docker-py#3332)."""
    original = http.client.HTTPResponse.begin

    def slow_begin(self: Any) -> Any:
        time.sleep(0.3)  # the command's output is in the socket before the headers are read
        return original(self)

    http.client.HTTPResponse.begin = slow_begin  # type: ignore[method-assign]
    try:
        obs = run(tool.run("echo hello; echo world"))
    finally:
        http.client.HTTPResponse.begin = original  # type: ignore[method-assign]
    assert body(obs.text) == "hello\nworld\n"


def test_copy_in_and_files(tool: bt.BashTool, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("X = 1\n")
    (repo / "README").write_text("hi\n")
    run(tool.copy_in(repo, "/testbed/repo"))
    obs = run(tool.run("cd repo && cat pkg/mod.py README && stat -c %U pkg/mod.py . pkg"))
    assert body(obs.text) == "X = 1\nhi\nagent\nagent\nagent\n"
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(repo / "README", arcname="from_tar.txt")
    run(tool.copy_in(archive, "/testbed/repo"))
    assert run(tool.run("test -O repo/from_tar.txt && cat repo/from_tar.txt")).ok
    run(tool.write_file("notes/new.txt", "ünïcode\n"))
    assert body(run(tool.run("cat notes/new.txt; stat -c %U notes/new.txt")).text) == (
        "ünïcode\nagent\n"
    )
    assert run(tool.read_file("/testbed/notes/new.txt")) == "ünïcode\n".encode()
    with pytest.raises(FileNotFoundError):
        run(tool.read_file("missing.txt"))


def test_host_deadline_when_the_wrapper_is_stopped(docker_client: Any, image: str) -> None:
    """The in-container timeout cannot act (its parent is stopped): the host kills."""

    async def go() -> tuple[Any, Any, float]:
        async with make_tool(docker_client, program_id="stopped", host_slack=1.0) as t:
            t0 = time.monotonic()
            obs = await t.run("kill -STOP $(ps -o ppid= -p $PPID); sleep 100", timeout=1)
            took = time.monotonic() - t0
            return obs, await t.run("echo next"), took

    obs, after, took = run(go())
    assert obs.info["timed_out"] and obs.info["host_killed"] == "tagged" and not obs.ok
    assert took < 1 + 1 + 2.5, took
    assert body(after.text) == "next\n"


def test_fork_bomb_is_contained(docker_client: Any, image: str) -> None:
    async def go() -> tuple[Any, Any, Any, float]:
        async with make_tool(docker_client, program_id="forkbomb", timeout=5) as t:
            t0 = time.monotonic()
            bomb = await t.run(":(){ :|:& };:")
            took = time.monotonic() - t0
            after = await t.run("echo alive")
            again = await t.run("echo alive; ps -e --no-headers | wc -l")
            return bomb, after, again, took

    bomb, after, again, took = run(go())
    assert took < 5 + 3, took
    assert "Resource temporarily unavailable" in bomb.text  # it hit the pids limit
    assert after.ok and "alive" in body(after.text)
    assert after.info["seconds"] < 5
    assert again.ok and int(body(again.text).split()[-1]) < 20  # the bomb is gone


def test_memory_hog_is_contained(docker_client: Any, image: str) -> None:
    async def go() -> tuple[Any, Any, str]:
        async with make_tool(docker_client, program_id="memhog", timeout=20) as t:
            hog = await t.run("python3 -c \"a=' '*(4*1024**3)\"")
            after = await t.run("echo alive")
            status = t.container.client.containers.get(t.container_id).status
            return hog, after, status

    hog, after, status = run(go())
    assert not hog.ok and hog.info["exit_code"] == 137 and not hog.info["timed_out"]
    assert status == "running"
    assert after.ok and body(after.text) == "alive\n"


def test_aclose_removes_the_container(docker_client: Any, image: str) -> None:
    import docker.errors

    t = make_tool(docker_client, program_id="closing")
    assert run(t.run("true")).ok  # created lazily
    cid = t.container_id
    assert docker_client.containers.get(cid).status == "running"
    run(t.aclose())
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(cid)
    run(t.aclose())  # twice is fine
    with pytest.raises(RuntimeError):
        run(t.run("true"))


def test_agent_cannot_stop_its_container(docker_client: Any, image: str) -> None:
    async def go() -> tuple[Any, Any]:
        async with make_tool(docker_client, program_id="killall") as t:
            await t.run("kill -9 -1")
            return await t.run("echo alive"), t.container.client.containers.get(t.container_id)

    after, container = run(go())
    assert after.ok and body(after.text) == "alive\n" and container.status == "running"


def test_remove_leftovers_after_a_crash(docker_client: Any, image: str) -> None:
    crashed_owner = f"{OWNER}-crashed"
    t = bt.BashTool("crash", client=docker_client,
                    container=bc.ContainerSpec(image=IMAGE, owner=crashed_owner))
    run(t.start())  # ... and the harness "dies" without aclose
    name = docker_client.containers.get(t.container_id).name
    assert bc.remove_leftovers(docker_client, owner=f"{OWNER}-nobody") == []
    assert bc.remove_leftovers(docker_client, owner=crashed_owner) == [name]
    assert not docker_client.containers.list(
        all=True, filters={"label": [f"{lb.OWNER_LABEL}={crashed_owner}"]}
    )
    run(t.aclose())  # the tool copes with its container being gone


def test_unkillable_command_is_abandoned(
    docker_client: Any, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If no kill works, the tool gives the stream up rather than hang the agent."""
    monkeypatch.setattr(bt, "KILL_GRACE", 0.3)

    async def go() -> tuple[Any, Any, float]:
        async with make_tool(docker_client, program_id="unkillable", host_slack=0.5) as t:
            t.sandbox.kill = lambda cmd: None  # type: ignore[method-assign]  # every kill fails
            t0 = time.monotonic()
            obs = await t.run("kill -STOP $(ps -o ppid= -p $PPID); sleep 100", timeout=1)
            took = time.monotonic() - t0
            return obs, await t.run("echo next"), took

    obs, after, took = run(go())
    assert obs.info["host_killed"] == "abandoned" and obs.info["timed_out"] and not obs.ok
    assert "abandoned" in obs.text
    assert took < 1 + 0.5 + 3 * 0.3 + 1.5, took
    assert body(after.text) == "next\n"


def test_cancelled_run_kills_the_command(tool: bt.BashTool) -> None:
    async def go() -> None:
        task = asyncio.create_task(tool.run("sleep 100; echo never"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
    for _ in range(20):
        obs = run(tool.run("pgrep -u agent -x sleep || echo none"))
        if body(obs.text) == "none\n":
            break
        time.sleep(0.1)
    assert body(obs.text) == "none\n"
