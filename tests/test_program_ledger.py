"""The program layer's public ledger (what the routers use instead of the table's fields) and
the estimators it shares with the policies, on hand-worked cases (pure Python)."""

from __future__ import annotations

import pytest

from predictor.means import SlidingMean
from predictor.programs import PromptGrowth
from server.programs import PER_PROGRAM_TOKENS, ProgramScheduler, Room
from server.programs.capacity import resume_class
from server.programs.mori import Mori
from server.programs.thunderagent import ThunderAgent


def test_a_sliding_mean_over_a_window_and_over_everything():
    window = SlidingMean(2)
    every = SlidingMean(None)
    for x in (1, 2, 6):
        window.add(x)
        every.add(x)
    assert (window.mean(0.0), len(window), window.total) == (4.0, 2, 8.0)
    assert (every.mean(0.0), len(every), every.total) == (3.0, 3, 9.0)
    assert SlidingMean(None).mean(-1.0) == -1.0


def test_prompt_growth_counts_only_a_larger_prompt_of_the_same_program():
    growth = PromptGrowth(None)
    growth.prompt("a", 100)
    growth.prompt("b", 500)  # a first prompt: no growth
    growth.prompt("a", 400)  # +300
    growth.prompt("a", 350)  # smaller: nothing
    assert not PromptGrowth(None).seen() and growth.seen()
    assert growth.mean(0.0) == 300.0 and growth.last_prompt("a") == 350
    growth.forget("a")
    growth.prompt("a", 1000)  # after forgetting: a first prompt again
    assert growth.mean(0.0) == 300.0


def test_the_ledger_a_router_keeps():
    ledger = ProgramScheduler()
    ledger.track("a", 0.0, 1000)
    ledger.track("b", 0.0, 500)
    ledger.track("c", 0.0)  # no prompt known: charged the allowance alone
    assert ledger.place("a", [Room("r0", 5000, 0), Room("r1", 5000, 100)]) == "r0"
    assert ledger.place("b", [Room("r0", 5000, 1100), Room("r1", 5000, 0)]) == "r1"
    assert ledger.replica_of("a") == "r0" and ledger.replica_of("c") is None
    assert ledger.held_by_replica() == {"r0": 1000 + PER_PROGRAM_TOKENS,
                                        "r1": 500 + PER_PROGRAM_TOKENS}
    assert ledger.held_by_replica(excluding="a") == {"r1": 500 + PER_PROGRAM_TOKENS}
    ledger.track("a", 1.0, 800)  # the latest prompt, not the largest
    assert ledger.charge("a") == 800 + PER_PROGRAM_TOKENS
    assert ledger.charge("nobody") == PER_PROGRAM_TOKENS and ledger.context_of("nobody") == 0
    ledger.forget("a")
    assert not ledger.knows("a") and ledger.table.ended_totals["active_s"] == 0.0


def test_a_replicas_room_is_its_books_resume_threshold_and_their_active_charge():
    books = ThunderAgent(capacity_tokens=1000, pause_above=0.95, pause_to=0.8, resume_to=0.85)
    books.turn_arrived("a", 300, 0.0)  # 400 charged <= 850: admitted at once
    assert books.room("r0") == Room("r0", 850, 400)
    assert ProgramScheduler(capacity_tokens=1000).room("r1") == Room("r1", 1000, 0)


def test_a_forced_resume_and_the_end_of_every_program():
    books = ThunderAgent(capacity_tokens=500)
    books.turn_arrived("a", 300, 0.0)
    books.turn_arrived("b", 300, 0.0)  # 400 + 400 > 500: b waits
    assert books.may_run("a") and not books.may_run("b")
    books.force_resume("b", 1.0)
    assert books.may_run("b") and books.active_usage() == 800
    books.end_all(2.0)
    assert len(books.table) == 0 and books.stats()["active_s"] == pytest.approx(2.0 + 1.0)


def test_the_baselines_resume_returning_programs_then_new_ones_then_acting_ones():
    s = Mori(capacity_tokens=10_000)
    s.turn_arrived("new", 100, 0.0)
    s.turn_arrived("back", 100, 0.0)
    s.turn_admitted("back", 0.0)
    s.turn_finished("back", 200, 1.0)
    acting = s.table.get("back")
    assert resume_class(acting) == 2
    s.turn_arrived("back", 300, 2.0)  # its next turn waits
    assert (resume_class(s.table.get("back")), resume_class(s.table.get("new"))) == (0, 1)

