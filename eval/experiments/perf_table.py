"""Print the emulated GPU's step times for standard batch shapes as markdown tables.

    harness eval perf-table [PROFILE ...]

With no arguments: H100 / H200 / A100 with Llama-3.1-8B and 8 x H100 with Llama-3.1-70B.
A profile table path (from ``harness profile``) works as an argument too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eval import ExperimentError
from server.perf.profile import Profile
from server.perf.registry import load_profile

DEFAULT_PROFILES = (
    "h100-llama-3.1-8b",
    "h200-llama-3.1-8b",
    "a100-llama-3.1-8b",
    "h100x8-llama-3.1-70b",
)


class PerfTableError(ExperimentError):
    """A profile name or table path that does not load; the message says why."""


@dataclass(frozen=True)
class PerfTableOptions:
    """The profiles to tabulate (`harness eval perf-table PROFILE ...`)."""

    profiles: tuple[str, ...] = field(default=DEFAULT_PROFILES, metadata={
        "positional": True, "nargs": "*", "metavar": "PROFILE",
        "help": "profile names or table paths"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", tuple(self.profiles) or DEFAULT_PROFILES)


def run_perf_table(options: PerfTableOptions) -> int:
    """Print the tables of `options.profiles`; exit status 0."""
    print_perf_tables(options.profiles)
    return 0


# (label, prefill chunks as (new tokens, tokens before), decode context lengths)
SHAPES: list[tuple[str, list[tuple[int, int]], list[int]]] = [
    ("prefill 1 x 2048, fresh", [(2048, 0)], []),
    ("prefill 1 x 8192, fresh", [(8192, 0)], []),
    ("prefill chunk 512 at ctx 8k", [(512, 8192)], []),
    ("decode 1 seq, ctx 1k", [], [1024]),
    ("decode 8 seqs, ctx 1k", [], [1024] * 8),
    ("decode 64 seqs, ctx 4k", [], [4096] * 64),
    ("decode 256 seqs, ctx 2k", [], [2048] * 256),
    ("mixed: chunk 512 fresh + 64 decodes ctx 2k", [(512, 0)], [2048] * 64),
]


def step_table(profiles: Sequence[Profile]) -> str:
    head = "| batch shape | " + " | ".join(p.name for p in profiles) + " |"
    sep = "|---|" + "---:|" * len(profiles)
    lines = [head, sep]
    for label, prefill, decode in SHAPES:
        cells = [f"{p.step_seconds(prefill, decode) * 1e3:.2f}" for p in profiles]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table(profiles: Sequence[Profile]) -> str:
    lines = [
        "| profile | weights GiB | KV bytes/token | KV capacity (tokens, util 0.9) | "
        "knee tokens | swap 10k tokens ms | reload 10k tokens ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in profiles:
        d = p.describe()
        lines.append(
            f"| {p.name} | {d['weight_gib']:.1f} | {d['kv_bytes_per_token']:,} | "
            f"{d['kv_capacity_tokens']:,} | {d['coefficients']['knee']:.0f} | "
            f"{p.swap_seconds(10_000) * 1e3:.1f} | {p.prefill_seconds(10_000) * 1e3:.1f} |"
        )
    return "\n".join(lines)


def coefficient_table(profiles: Sequence[Profile]) -> str:
    keys = ("c0", "c1", "knee", "c2", "c3", "c4", "c5")
    lines = [
        "| profile | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for p in profiles:
        c = p.describe()["coefficients"]
        lines.append(f"| {p.name} | " + " | ".join(f"{c[k]:.3g}" for k in keys) + " |")
    return "\n".join(lines)


def print_perf_tables(names: Sequence[str] = DEFAULT_PROFILES) -> None:
    """The three tables for the named profiles (or table paths); an unknown name raises
    `PerfTableError` before anything is printed."""
    try:
        profiles = [load_profile(n) for n in names]
    except ValueError as e:
        raise PerfTableError(str(e)) from None
    print("Step time, milliseconds\n")
    print(step_table(profiles))
    print("\nMemory, swap and reload\n")
    print(summary_table(profiles))
    print("\nCoefficients (seconds; t = c0 + c1*max(T, knee) + c2*A + c3*D + c4*S + c5*T)\n")
    print(coefficient_table(profiles))
