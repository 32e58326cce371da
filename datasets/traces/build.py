"""Write the committed benchmark traces (format: datasets/traces/README.md).

Run from the repository root: `.venv/bin/python datasets/traces/build.py [--check]`.
Each file comes from a generator in `eval/workloads/` with a fixed seed, so it is rebuilt byte for
byte; `--check` rebuilds in memory and fails if a committed file differs (a generator changed).
A replay at another load keeps the programs and re-draws the arrivals:
`load_or_generate("datasets/traces/swe-100.jsonl", jps=4.0, seed=0)`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common.trace import load_trace, save_trace  # noqa: E402
from eval.workloads.registry import TRACES  # noqa: E402

HERE = Path(__file__).resolve().parent

#: file name -> (generator name, programs, jobs per second, seed)
FILES: dict[str, tuple[str, int, float, int]] = {
    "swe-100.jsonl": ("swe", 100, 0.5, 100),
    "bfcl-100.jsonl": ("bfcl", 100, 0.5, 200),
    "mix-200.jsonl": ("mix", 200, 2.0, 300),
}

MAX_BYTES = 1_000_000


def build(out_dir: Path) -> list[Path]:
    written = []
    for name, (generator, n, jps, seed) in FILES.items():
        trace = TRACES[generator](n, jps, seed)
        path = save_trace(trace, out_dir / name)
        size = path.stat().st_size
        if size >= MAX_BYTES:
            raise SystemExit(f"{path} is {size} bytes; keep committed traces under {MAX_BYTES}")
        written.append(path)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if a committed file differs")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            stale = [
                p.name
                for p in build(Path(tmp))
                if not (HERE / p.name).exists() or (HERE / p.name).read_bytes() != p.read_bytes()
            ]
        if stale:
            print(f"out of date: {', '.join(stale)}; run datasets/traces/build.py")
            return 1
        print("traces up to date")
        return 0
    for path in build(HERE):
        trace_stats = load_trace(path).stats()
        print(
            f"{path.relative_to(ROOT)}: {path.stat().st_size:,} bytes, "
            f"{trace_stats.n_programs} programs, {trace_stats.turns_mean:.1f} turns, "
            f"{trace_stats.tokens_per_program_mean:,.0f} tokens/program"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
