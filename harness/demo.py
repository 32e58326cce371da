"""`harness demo`: the README's main job until the benchmarks land.

Starts the co-located server (emulated GPU, chosen policy), runs a batch of small agent programs
concurrently through it (real HTTP, program ids, hints and interception events; the "tools"
wait for sampled durations), and prints per-program job completion time and how much of each
turn's prompt came from the KV cache.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from common.errors import UserError
from harness.agent import tool_ended, tool_started
from harness.events_client import EventClient
from harness.model_client import ChatClient
from harness.server_process import ServerProcess
from predictor.durations import ToolDurationModel
from predictor.gaps import GapModel

TOOLS = {"ls": (0.05, 0.3), "grep": (0.1, 0.5), "pytest": (1.0, 3.0), "pip": (2.0, 4.0)}
WORDS = ("module parser token branch commit test failure fixture import value return index "
         "buffer config handler request schema migration cache worker queue").split()


@dataclass
class ProgramResult:
    program_id: str
    turns: int = 0
    jct_s: float = 0.0
    prompt_tokens: list[int] = field(default_factory=list)
    cached_tokens: list[int] = field(default_factory=list)


async def run_program(client: ChatClient, events: EventClient, durations: ToolDurationModel,
                      gaps: GapModel, program_id: str, turns: int,
                      rng: random.Random) -> ProgramResult:
    result = ProgramResult(program_id)
    started = time.monotonic()
    events.emit("program_start", program_id)
    messages = [{"role": "system", "content": "You are a software agent. Think, then act."},
                {"role": "user", "content": f"Task {program_id}: " +
                 " ".join(rng.choice(WORDS) for _ in range(400))}]
    for turn in range(turns):
        last = turn == turns - 1
        tool = rng.choice(list(TOOLS))
        action = "submit" if last else f"{tool} {rng.choice(WORDS)}"
        text = f"Thought: step {turn}, I will check the {rng.choice(WORDS)}.\nAction: {action}"
        completion = await client.complete(
            messages, program_id=program_id, max_tokens=64,
            hints={"turn": turn, "tool": None if last else tool, "last": last,
                   "emulate_text": text})
        result.turns += 1
        result.prompt_tokens.append(completion.prompt_tokens)
        result.cached_tokens.append(completion.cached_tokens)
        if last:
            break
        low, high = TOOLS[tool]
        seconds = rng.uniform(low, high)
        tool_started(events, durations, program_id, tool, action, gaps=gaps)
        await asyncio.sleep(seconds)
        output = " ".join(rng.choice(WORDS) for _ in range(rng.randint(50, 300)))
        tool_ended(events, durations, program_id, tool, seconds, output, gaps)
        messages += [{"role": "assistant", "content": completion.text},
                     {"role": "user", "content": f"Observation: {output}"}]
    events.emit("program_end", program_id)
    result.jct_s = time.monotonic() - started
    return result


async def run_all(base_url: str, model: str, programs: int, seed: int) -> tuple[list, EventClient]:
    rng = random.Random(seed)
    client = ChatClient(base_url, model)
    async with EventClient(base_url) as events:
        durations, gaps = ToolDurationModel(), GapModel()  # learnt by all programs together
        jobs = [run_program(client, events, durations, gaps, f"demo-{i}", rng.randint(3, 6),
                            random.Random(rng.random())) for i in range(programs)]
        results = await asyncio.gather(*jobs)
    await client.aclose()
    return results, events


def report(console: Console, policy: str, results: list[ProgramResult], events: EventClient,
           wall_s: float) -> None:
    table = Table(title=f"harness demo: {len(results)} programs, policy {policy}")
    for column in ("program", "turns", "JCT (s)", "prompt tokens", "cached (later turns)"):
        table.add_column(column, justify="right")
    for r in results:
        later_prompt = sum(r.prompt_tokens[1:]) or 1
        table.add_row(r.program_id, str(r.turns), f"{r.jct_s:.2f}", str(sum(r.prompt_tokens)),
                      f"{100 * sum(r.cached_tokens[1:]) / later_prompt:.0f}%")
    console.print(table)
    jcts = [r.jct_s for r in results]
    console.print(f"mean JCT {statistics.mean(jcts):.2f} s, max {max(jcts):.2f} s, wall "
                  f"{wall_s:.1f} s; events sent {events.sent}, dropped {events.dropped}")


def run_demo(policy: str = "continuum", profile: str | None = None, programs: int = 12,
             seed: int = 0, server: str | None = None) -> int:
    """`programs` synthetic agent programs through a co-located server with `policy` (emulated
    GPU `profile`), or through the running one at URL `server`; prints the report."""
    if programs < 1:
        raise UserError("--programs must be at least 1")
    console = Console()
    started = time.monotonic()
    if server:
        results, events = asyncio.run(run_all(server, "llama-3.1-8b", programs, seed))
    else:
        console.print(f"starting harness serve --policy {policy} (emulated GPU) ...")
        with ServerProcess(policy=policy, profile=profile) as process:
            console.print(f"server up at {process.base_url} (log {process.log_path})")
            results, events = asyncio.run(run_all(process.base_url, "llama-3.1-8b",
                                                  programs, seed))
    report(console, policy, results, events, time.monotonic() - started)
    return 0
