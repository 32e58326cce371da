"""Write the committed predictor data, datasets/predictor/examples.jsonl (schema:
predictor/data.py, README.md here).

Run from the repository root: `.venv/bin/python datasets/predictor/build.py [--check]`.
The file is the recorded requests of our four agents (datasets/*/trajectories*, counted with
our tokenizer) followed by synthetic requests from `predictor.synthetic.generate(N, SEED)`; both
are deterministic, so the file is rebuilt byte for byte and `--check` fails if it is stale.
`--runs DIR...` adds requests from harness runs (OUT/trajectories/*.traj.json, which carry
measured tool seconds) and `--traces FILE...` the turns of benchmark traces; the committed file
uses neither (runs are not committed, trace turns carry no text), so pass them to build a
bigger local file with `--out`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from predictor.data import (  # noqa: E402
    DEFAULT_DATA,
    Example,
    examples_from_trace,
    examples_from_trajectory,
    recorded_trajectory_files,
    save_examples,
)
from predictor.synthetic import generate  # noqa: E402

SYNTHETIC = 1800
SEED = 7
MAX_BYTES = 1_500_000


def build(out: Path, synthetic: int = SYNTHETIC, seed: int = SEED,
          runs: list[Path] | None = None, traces: list[Path] | None = None) -> Path:
    examples: list[Example] = []
    for path in recorded_trajectory_files():
        examples += examples_from_trajectory(path)
    for run in runs or []:
        for path in sorted(Path(run).glob("trajectories/*.traj.json")):
            examples += examples_from_trajectory(path)
    for trace in traces or []:
        examples += examples_from_trace(trace)
    examples += generate(synthetic, seed)
    path = save_examples(examples, out)
    size = path.stat().st_size
    counts = Counter((e.source or "?").split(":")[0] for e in examples)
    timed = sum(e.tool_seconds is not None for e in examples)
    print(f"{path}: {len(examples)} examples ({dict(counts)}), {timed} with tool seconds, "
          f"{size} bytes")
    if out.resolve() == DEFAULT_DATA.resolve() and size >= MAX_BYTES:
        raise SystemExit(f"{path} is {size} bytes; keep the committed file under {MAX_BYTES}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the committed file differs")
    ap.add_argument("--out", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--synthetic", type=int, default=SYNTHETIC, help="synthetic examples (min)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--runs", type=Path, nargs="*", default=[], help="harness run folders")
    ap.add_argument("--traces", type=Path, nargs="*", default=[], help="benchmark trace files")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = build(Path(tmp) / "examples.jsonl", args.synthetic, args.seed)
            if not DEFAULT_DATA.exists() or DEFAULT_DATA.read_bytes() != fresh.read_bytes():
                print(f"out of date: {DEFAULT_DATA}; run datasets/predictor/build.py")
                return 1
        print("predictor data up to date")
        return 0
    build(args.out, args.synthetic, args.seed, args.runs, args.traces)
    return 0


if __name__ == "__main__":
    sys.exit(main())
