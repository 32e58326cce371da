"""How much one BashTool.run costs compared with a bare `docker exec`.

    harness eval bash-overhead [-n 30]

Runs `true` N times through BashTool.run (runner script, `timeout`, `bash -lc`,
output capture, exit-code lookup) and N times as `docker exec CONTAINER true`
(a subprocess of the docker CLI) in the same container, after a few warm-up
runs each, and prints the mean, median and p90 of both in milliseconds.  A third
line runs the tool's in-container wrapper through the CLI, to split the difference
into in-container work and the Python side.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import time
from dataclasses import dataclass, field

from eval import ExperimentError
from harness.tools.bash import BashTool
from harness.tools.bash_container import RUNNER, ContainerSpec, remove_leftovers
from harness.tools.docker_client import shared_client
from harness.tools.sandbox_image import DEFAULT_IMAGE

WARMUP = 3


def summary(name: str, ms: list[float]) -> str:
    p90 = sorted(ms)[max(0, round(0.9 * len(ms)) - 1)]
    return (
        f"{name:<34} mean {statistics.fmean(ms):7.1f} ms   median {statistics.median(ms):7.1f} ms"
        f"   p90 {p90:7.1f} ms"
    )


async def measure(n: int, image: str) -> tuple[list[float], list[float], list[float]]:
    owner = f"bash-overhead-{time.time_ns()}"
    tool = BashTool("overhead", container=ContainerSpec(image=image, owner=owner))
    try:
        await tool.start()
        cid = tool.container_id
        assert cid is not None
        tool_ms: list[float] = []
        for i in range(WARMUP + n):
            t0 = time.perf_counter()
            obs = await tool.run("true")
            dt = (time.perf_counter() - t0) * 1000
            if not obs.ok:
                raise RuntimeError(f"`true` failed in the tool: {obs.text}")
            if i >= WARMUP:
                tool_ms.append(dt)
        exec_ms: list[float] = []
        for i in range(WARMUP + n):
            t0 = time.perf_counter()
            subprocess.run(["docker", "exec", "-u", "agent", cid, "true"], check=True)
            dt = (time.perf_counter() - t0) * 1000
            if i >= WARMUP:
                exec_ms.append(dt)
        # the same in-container work as the tool (runner, timeout, bash -lc), through the CLI
        wrapped = ["docker", "exec", "-u", "agent", "-w", tool.workdir, cid, "sh", RUNNER]
        wrapped += ["60", "true", "230"]
        wrapped_ms: list[float] = []
        for i in range(WARMUP + n):
            t0 = time.perf_counter()
            subprocess.run(wrapped, check=True)
            dt = (time.perf_counter() - t0) * 1000
            if i >= WARMUP:
                wrapped_ms.append(dt)
        return tool_ms, exec_ms, wrapped_ms
    finally:
        await tool.aclose()
        remove_leftovers(shared_client(), owner=owner)


class BashOverheadError(ExperimentError):
    """A measurement that cannot be made as asked (printed without a traceback)."""


@dataclass(frozen=True)
class BashOverheadOptions:
    """One measurement (each field is an option of `harness eval bash-overhead`)."""

    n: int = field(default=30, metadata={"flags": ("-n",), "help": "measured runs of each"})
    image: str = field(default=DEFAULT_IMAGE, metadata={"help": "sandbox image"})

    def __post_init__(self) -> None:
        if self.n < 1:
            raise BashOverheadError(f"-n {self.n}: give at least 1 run")


def run_bash_overhead(options: BashOverheadOptions) -> int:
    """Measure and print the three lines; exit status 0."""
    n, image = options.n, options.image
    tool_ms, exec_ms, wrapped_ms = asyncio.run(measure(n, image))
    print(f"N = {n} runs of `true` each (after {WARMUP} warm-up runs)")
    print(summary("BashTool.run('true')", tool_ms))
    print(summary("docker exec CONTAINER true (CLI)", exec_ms))
    extra = statistics.fmean(tool_ms) - statistics.fmean(exec_ms)
    print(f"BashTool.run - docker exec: {extra:+.1f} ms (mean)")
    print(summary("docker exec ... sh RUNNER (CLI)", wrapped_ms))
    return 0
