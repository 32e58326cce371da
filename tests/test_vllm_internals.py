"""Every reach into vLLM's internals (`server.vllm_internals`) still holds in the installed
vLLM: each named thing exists and takes the parameters we call it with, the live scheduler has
the attributes our subclass reads, our wraps sit where vLLM calls, and no module of ours
imports from vLLM without an entry in the list. A vLLM upgrade that changes one fails here,
naming our module that relies on it, instead of in the middle of a run."""

from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # before vLLM is imported (no GPU here)

import pytest  # noqa: E402

from server.vllm_internals import (  # noqa: E402
    BLOCK_POOL_ATTRIBUTES,
    ENGINE_ARGS_FIELDS,
    REACHES,
    REQUEST_ATTRIBUTES,
    SCHEDULER_ATTRIBUTES,
    Reach,
    missing_attributes,
    problem,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("reach", REACHES, ids=lambda r: r.target.rsplit(":", 1)[-1])
def test_each_reach_holds_in_the_installed_vllm(reach):
    assert problem(reach) is None


def test_a_changed_signature_or_a_gone_name_is_reported_with_who_relies_on_it():
    moved = Reach("our.module", "vllm.v1.core.block_pool:BlockPool.free_blocks",
                  ("self", "blocks"))
    assert "now takes ('self', 'ordered_blocks')" in problem(moved)
    assert "our.module" in problem(moved)
    gone = Reach("our.module", "vllm.v1.core.block_pool:BlockPool.free_all_blocks")
    assert "is gone" in problem(gone)


def test_the_engine_args_we_set_exist():
    from vllm.engine.arg_utils import EngineArgs  # vLLM: start-up cost

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    assert [name for name in ENGINE_ARGS_FIELDS if name not in known] == []


def test_every_vllm_import_of_ours_is_in_the_list():
    """The list is the one place: an import from vLLM anywhere in the project's code (tests
    aside) must name something an entry covers."""
    covered = {r.target.split(".", 1)[0] if ":" not in r.target else r.target
               for r in REACHES}
    uncovered = []
    for package in ("server", "cluster", "sim", "harness", "eval", "cli", "common",
                    "predictor"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.split(".")[0] == "vllm"):
                    continue
                for alias in node.names:
                    as_name = f"{node.module}:{alias.name}"  # a name in a module
                    as_module = f"{node.module}.{alias.name}:"  # a module in a package
                    if not any(t.startswith((as_name, as_module)) for t in covered):
                        uncovered.append(f"{path.relative_to(ROOT)}: {as_name}")
    assert uncovered == [], "add an entry to server.vllm_internals.REACHES"


@pytest.mark.engine
def test_a_live_scheduler_has_what_our_subclass_reads_and_our_wraps_are_in_place():
    from vllm_driver import Driver, make_scheduler

    scheduler = make_scheduler("preserve")  # keeps every finished turn until program_end
    assert missing_attributes(scheduler, SCHEDULER_ATTRIBUTES) == []
    pool = scheduler.kv_cache_manager.block_pool
    assert missing_attributes(pool, BLOCK_POOL_ATTRIBUTES) == []
    # vLLM calls these through the live objects: our wrap is what it finds
    assert scheduler.kv_cache_manager.allocate_slots == scheduler._allocate_or_unpin
    driver = Driver(scheduler)
    try:
        request = driver.submit("r-0", list(range(10, 40)), "P", max_tokens=2)
        assert missing_attributes(request, REQUEST_ATTRIBUTES) == []
        driver.run_until_finished("r-0")
        assert "P" in scheduler.pins  # a pin took the finished turn's blocks
    finally:
        driver.close()
