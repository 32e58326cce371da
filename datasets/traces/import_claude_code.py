"""Import Claude Code sessions (kv-cache-tester's ``traces/`` format) and check them against
their source; optionally write them as one trace file for `harness bench --trace`.

Run from the repository root::

    .venv/bin/python datasets/traces/import_claude_code.py FOLDER_OR_FILES... [--out T.jsonl]

It prints the sessions imported, their requests, the round trip's mismatches (every request's
imported prompt against ``in``, and its prefix shared with the previous prompt against what
the block hashes say: `eval.workloads.importers.claude_code.check_round_trip`), the sub-agents,
the turns that keep only part of the conversation (compactions: less than half of it), the gap
quantiles per kind and the longest prompt. Exit status 1 when anything mismatches. The
sessions are the user's data: write ``--out`` outside the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.trace import Program, Trace, save_trace, summarize  # noqa: E402
from eval.workloads.importers.claude_code import (  # noqa: E402
    check_round_trip,
    common_blocks,
    conversations_of,
    programs_from_claude_code,
)


def session_files(args: list[str]) -> list[Path]:
    """The ``*.json`` files of each folder given, and each file given, in name order."""
    files: list[Path] = []
    for arg in args:
        path = Path(arg)
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    return files


def earlier_is_longer(data: dict) -> int:
    """Requests whose prompt shares more blocks with some earlier request of its conversation
    than with the previous one (what keeping a prefix of the previous prompt cannot say)."""
    count = 0
    for conv in conversations_of(data):
        seen: set[int] = set()
        for j, r in enumerate(conv.requests):
            best = 0
            for h in r["hash_ids"]:
                if h not in seen:
                    break
                best += 1
            previous = common_blocks(conv.requests[j - 1]["hash_ids"], r["hash_ids"]) if j else 0
            count += best > previous
            seen.update(r["hash_ids"])
    return count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="session folders or files")
    ap.add_argument("--out", help="write the imported programs as one trace file (JSONL)")
    args = ap.parse_args()
    files = session_files(args.paths)
    programs: list[Program] = []
    mismatches: list[str] = []
    requests = elsewhere = 0
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        imported = programs_from_claude_code(data, program_id=path.stem)
        mismatches += [f"{path.name}: {line}" for line in check_round_trip(data, imported)]
        requests += sum(p.n_turns for p in imported)
        elsewhere += earlier_is_longer(data)
        programs += imported
    trace = Trace(name="claude-code", description=f"{len(files)} Claude Code sessions",
                  params={"imported": [str(p) for p in args.paths], "fmt": "claude-code"},
                  programs=programs)
    report(trace, len(files), requests, mismatches, elsewhere)
    if args.out:
        print(f"written: {save_trace(trace, args.out)}")
    return 1 if mismatches else 0


def report(trace: Trace, sessions: int, requests: int, mismatches: list[str],
           elsewhere: int) -> None:
    subagents = [p for p in trace.programs if p.parent is not None]
    waited = sum(1 for p in subagents if p.meta.get("duration_s") is not None)
    kept = [(p, i) for p in trace.programs for i, t in enumerate(p.turns)
            if t.kept_tokens is not None]
    compactions = sum(1 for p, i in kept if 2 * p.reused_tokens(i) < p.context_after(i - 1))
    empty = sum(p.meta.get("empty_subagents", 0) for p in trace.programs)
    stats = summarize(trace)
    print(f"sessions imported: {sessions}")
    print(f"requests: {requests:,} (programs: {len(trace)})")
    print(f"mismatches: {len(mismatches)}")
    for line in mismatches[:20]:
        print(f"  {line}")
    print(f"sub-agents: {len(subagents)} ({waited} waited for, {len(subagents) - waited} "
          f"launched apart; {empty} with no requests left out)")
    print(f"turns keeping part of the conversation: {len(kept):,} (compactions, keeping less "
          f"than half: {compactions:,})")
    print(f"requests sharing more with an earlier request than with the previous: {elsewhere:,}")
    print(f"longest prompt: {stats.max_prompt:,} tokens")
    for kind, q in stats.gap_s.items():
        print(f"gap s, {kind}: n {q.n:,}, p50 {q.p50:.1f}, p90 {q.p90:.1f}, p99 {q.p99:.1f}, "
              f"max {q.max:.1f}")


if __name__ == "__main__":
    sys.exit(main())
