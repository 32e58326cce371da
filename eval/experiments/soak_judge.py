"""The soak's bounds, in one place, and the judge that holds a run record to them.

Why a judge apart from the run: a soak is an hour of wall time, so its verdict must be
reproducible from the record alone (`harness eval soak --resume` re-judges what an earlier,
killed run left), and the rules must be testable on hand-made samples. docs/soak.md states the
same bounds; a change here changes them there.

A check passes (True), fails (False) or could not be made (None: the run was too short for it,
or the server never reported the figure), and says why in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: a request not answered (a first token, or an error) within this many seconds is a hang
REQUEST_TIMEOUT_S = 120.0
#: how many hung requests a run may have
MAX_HANGS = 0
#: RSS (API server, engine core) may grow this share above its value after the warm-up
RSS_GROWTH = 0.05
#: the warm-up after which the RSS baseline is taken (seconds of one server's life) ...
WARMUP_S = 600.0
#: ... or this share of the run, whichever is shorter (short runs)
WARMUP_SHARE = 1 / 6
#: the longest a turn may wait for its first token, in wall seconds
OLDEST_WAIT_S = 60.0
#: slack beyond the server's silent-program bound for the drain check: two samples' worth is
#: added by the caller; this covers a step that comes late
DRAIN_SLACK_S = 10.0

#: what must be back to zero once the last client has left (sample fields; a cluster's router
#: program books, `router_programs`, are None for one server and so count as zero there)
DRAINED = ("programs_tracked", "pinned_now", "orphan_blocks", "router_programs")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None
    detail: str

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[self.passed]
        return f"{mark}  {self.name}: {self.detail}"


def warmup_s(run_s: float) -> float:
    return min(WARMUP_S, run_s * WARMUP_SHARE)


def judge(samples: Sequence[dict[str, Any]], tally: dict[str, Any], *, run_s: float,
          drain_bound_s: float) -> list[Check]:
    """Every check on one run: `samples` as `eval.experiments.soak_sampler` makes them (with
    ``t``, ``phase``, ``epoch`` and ``epoch_start``), `tally` the request counts, `run_s` the
    planned driving time, `drain_bound_s` how long the server may take to forget what the
    departed clients left (its silent-program bound plus slack)."""
    return [answered(tally),
            *(rss(samples, key, warmup_s(run_s)) for key in ("api_rss", "engine_rss")),
            drained(samples, drain_bound_s),
            oldest_wait(samples)]


#: where a sent request ends, each exactly once (`eval.experiments.soak_faults.Tally`), and
#: how the check names each
OUTCOMES = (("answered", "answered"), ("refused", "refused with an error"), ("hangs", "hung"),
            ("killed_turns", "cancelled by the fault plan"),
            ("left_at_end", "left at the end"), ("client_errors", "client errors"))


def answered(tally: dict[str, Any]) -> Check:
    """Every request sent is in exactly one outcome (a request in none, or in two, is a
    counting bug that would hide a lost one); none hung beyond `MAX_HANGS`; and none failed in
    our own client, whose breaking leaves the server's answer unknown."""
    counts = {key: int(tally.get(key, 0)) for key, _ in OUTCOMES}
    sent = int(tally.get("sent", 0))
    unaccounted = sent - sum(counts.values())
    detail = (f"{sent} sent = " + " + ".join(f"{counts[key]} {name}" for key, name in OUTCOMES)
              + f" (hangs bound {MAX_HANGS}, timeout "
              f"{tally.get('timeout_s', REQUEST_TIMEOUT_S):g} s)")
    if unaccounted > 0:
        detail += f"; {unaccounted} unaccounted for"
    elif unaccounted < 0:
        detail += f"; {-unaccounted} counted twice"
    if counts["client_errors"]:
        detail += "; our client broke, so the server's answers are unknown"
    passed = (sent > 0 and counts["hangs"] <= MAX_HANGS and unaccounted == 0
              and counts["client_errors"] == 0)
    return Check("every request answered or refused", passed, detail)


def rss(samples: Sequence[dict[str, Any]], key: str, warmup: float) -> Check:
    """Per server life (``epoch``: a restart starts a new process, and its life begins once it
    answers), the first driving sample after the warm-up is the baseline; every later sample
    of that life stays within `RSS_GROWTH` of it. Samples taken while the server was down
    (``phase == "down"``) are left out."""
    name = f"{key} within {RSS_GROWTH:.0%} of its warm value"
    worst: tuple[float, int, float] | None = None  # (growth, epoch, t)
    lives = 0
    for epoch in sorted({s.get("epoch", 0) for s in samples}):
        life = [s for s in samples if s.get("epoch", 0) == epoch and s.get(key)
                and s.get("phase") != "down"]  # a restart's new process, still starting
        base = next((s for s in life if s.get("phase") == "run"
                     and s["t"] - s.get("epoch_start", 0.0) >= warmup), None)
        if base is None:
            continue
        lives += 1
        for s in life:
            if s["t"] > base["t"]:
                growth = s[key] / base[key] - 1.0
                if worst is None or growth > worst[0]:
                    worst = (growth, epoch, s["t"])
    if lives == 0:
        return Check(name, None, f"no sample after a warm-up of {warmup:.0f} s")
    if worst is None:
        return Check(name, None, "no sample after the baseline")
    growth, epoch, t = worst
    return Check(name, growth <= RSS_GROWTH,
                 f"largest growth {growth:+.1%} (server life {epoch}, at {t:.0f} s)")


def drained(samples: Sequence[dict[str, Any]], bound_s: float) -> Check:
    """After the last client left (``phase == "drain"``), the program table, the pins and the
    orphaned KV (and a cluster router's program books) reach zero within `bound_s`. A drain
    cut short before the bound that has not reached zero yet is not a failure: it could not
    be checked."""
    name = "programs, pins and orphaned KV back to zero"
    drain = [s for s in samples if s.get("phase") == "drain"]
    if not drain:
        return Check(name, None, "the run has no drain phase")
    start = drain[0]["t"]
    for s in drain:
        if all(not s.get(key) for key in DRAINED):
            took = s["t"] - start
            return Check(name, took <= bound_s, f"zero {took:.0f} s after the last client left "
                         f"(bound {bound_s:.0f} s)")
    last = drain[-1]
    left = ", ".join(f"{key} {last[key]}" for key in DRAINED if last.get(key) is not None)
    waited = last["t"] - start
    if waited < bound_s:
        return Check(name, None, f"still {left} after a drain of {waited:.0f} s, shorter than "
                     f"the server's bound {bound_s:.0f} s: not checked")
    return Check(name, False, f"still {left} {waited:.0f} s after the last client left "
                 f"(bound {bound_s:.0f} s)")


def oldest_wait(samples: Sequence[dict[str, Any]]) -> Check:
    name = f"no turn waits over {OLDEST_WAIT_S:g} s for its first token"
    waits = [(s.get("oldest_wait_s") or 0.0, s["t"]) for s in samples]
    if not waits:
        return Check(name, None, "no samples")
    worst, t = max(waits)
    return Check(name, worst <= OLDEST_WAIT_S, f"oldest {worst:.1f} s (at {t:.0f} s)")
