"""`harness eval step-interference`: how much a prefill chunk mixed into a decode batch slows
that batch's step on the emulated GPU, beside published figures for the same setting.

Why: AMPD's case for disaggregation is prefill-decode interference (a co-located replica's
decodes wait for the prefill chunk that shares their step). If the emulated step were too kind
to a mixed batch, co-located serving would look better here than on a real GPU, and AMPD's
regime (issue 22) could not appear for that reason alone. The check: the step model's
inflation, ``t(chunk + decodes) / t(decodes)``, per chunk size, against what has been
published for a mixed step on a real GPU.

Published figures found (public pages; the search is in the commit that added this module):

* Georgia Tech's "Week 8 - Chunked Prefill" lab (hungchun0201.github.io, agentic-ai-survey,
  ai-infra-basics/hands-on/week-08), 1 x H100 80GB, vLLM, Llama-3.1-8B-Instruct: 30 decoding
  requests at about 10 ms a step; a 4096-token prompt without chunking stalls them for about
  200 ms; with 512-token chunks the longest stall is about 25 ms. Round, illustrative figures
  from a lab handout ("~"), not a measurement table; the decodes' context is not given (we take
  1k tokens: a decode's KV read is a small part of an 8B step at this batch).
* Sarathi-Serve (OSDI'24) and DistServe (OSDI'24) describe the same mechanism (decode steps are
  bound by reading the weights, a prefill chunk by FLOPs, so a mixed step costs about as much
  as its chunk) and show it in figures; their exact per-step figures were not in the stored
  copies we could read, so they are not in the table.

The emulated rows are `server.perf` step times, computed (no run): nothing here is fitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from eval import ExperimentError
from server.perf.profile import Profile
from server.perf.registry import load_profile


class StepInterferenceError(ExperimentError):
    """A profile that does not load, or a chunk size that is not a positive integer."""


@dataclass(frozen=True)
class Published:
    """One published mixed-step figure: a decode batch alone and with one prefill chunk."""

    source: str
    profile: str  # the emulated profile of the same GPU and model
    decodes: int
    decode_context: int  # tokens each decode attends over (assumed where not published)
    decode_ms: float  # the decode batch's step alone
    chunk: int  # prefill tokens mixed into the step (the whole prompt when unchunked)
    mixed_ms: float  # the step with the chunk


#: Georgia Tech's chunked-prefill lab (module docstring): H100, Llama-3.1-8B, 30 decodes.
PUBLISHED: tuple[Published, ...] = (
    Published("GT lab week 8 (H100, vLLM)", "h100-llama-3.1-8b", 30, 1024, 10.0, 512, 25.0),
    Published("GT lab week 8 (H100, vLLM)", "h100-llama-3.1-8b", 30, 1024, 10.0, 4096, 200.0),
)

#: AMPD's setting (Llama-3.1-70B on H20, `eval.ampd.bench`) at each TP degree it can run at.
DEFAULT_PROFILES = ("h20x2-llama-3.1-70b", "h20x4-llama-3.1-70b", "h20x8-llama-3.1-70b")
DEFAULT_CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
DEFAULT_DECODES = 32
DEFAULT_DECODE_CONTEXT = 4096


@dataclass(frozen=True)
class StepInterferenceOptions:
    """The sweep's profiles and batch (each field is an option of
    `harness eval step-interference`)."""

    profiles: tuple[str, ...] = field(default=DEFAULT_PROFILES, metadata={
        "positional": True, "nargs": "*", "metavar": "PROFILE",
        "help": "profiles of the chunk-size sweep"})
    chunks: tuple[int, ...] = field(default=DEFAULT_CHUNKS, metadata={
        "help": "comma-separated prefill chunk sizes, tokens"})
    decodes: int = field(default=DEFAULT_DECODES, metadata={
        "help": "decoding sequences in the step"})
    context: int = field(default=DEFAULT_DECODE_CONTEXT, metadata={
        "help": "each decode's context, tokens"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "profiles", tuple(self.profiles) or DEFAULT_PROFILES)
        if not self.chunks or min(self.chunks) < 1:
            raise StepInterferenceError(f"--chunks {','.join(map(str, self.chunks))!r}: give "
                                        "positive token counts, e.g. 512,2048")
        if self.decodes < 1 or self.context < 1:
            raise StepInterferenceError("--decodes and --context: give at least 1")


def run_step_interference(options: StepInterferenceOptions) -> int:
    """Print the report for `options`; exit status 0."""
    print(report(options.profiles, options.chunks, options.decodes, options.context))
    return 0


def step_ms(profile: Profile, chunk: int, decodes: int, context: int) -> float:
    """One step of `decodes` sequences at `context` tokens plus a fresh prefill chunk of
    `chunk` tokens (0: none), in milliseconds."""
    prefill = [(chunk, 0)] if chunk > 0 else []
    return profile.step_seconds(prefill, [context] * decodes) * 1e3


def inflation(profile: Profile, chunk: int, decodes: int, context: int) -> float:
    """``t(chunk + decodes) / t(decodes)``: how much longer every decode's token takes."""
    return step_ms(profile, chunk, decodes, context) / step_ms(profile, 0, decodes, context)


def _load(name: str) -> Profile:
    try:
        return load_profile(name)
    except (ValueError, OSError) as exc:
        raise StepInterferenceError(f"profile {name!r}: {exc}") from None


def published_table() -> str:
    """The published figures beside the emulated step for the same setting."""
    lines = ["| source | profile | decodes x ctx | chunk | published decode / mixed ms | "
             "published inflation | emulated decode / mixed ms | emulated inflation |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for p in PUBLISHED:
        prof = _load(p.profile)
        alone = step_ms(prof, 0, p.decodes, p.decode_context)
        mixed = step_ms(prof, p.chunk, p.decodes, p.decode_context)
        lines.append(f"| {p.source} | {p.profile} | {p.decodes} x {p.decode_context} | "
                     f"{p.chunk} | {p.decode_ms:g} / {p.mixed_ms:g} | "
                     f"{p.mixed_ms / p.decode_ms:.1f}x | {alone:.1f} / {mixed:.1f} | "
                     f"{mixed / alone:.1f}x |")
    return "\n".join(lines)


def sweep_table(profiles: Sequence[str], chunks: Sequence[int], decodes: int,
                context: int) -> str:
    """Inflation by chunk size for each profile (no published figure: AMPD's H20 setting)."""
    if any(c < 1 for c in chunks) or decodes < 1 or context < 1:
        raise StepInterferenceError("chunk sizes, --decodes and --context must be >= 1")
    loaded = [_load(n) for n in profiles]
    head = ("| profile | decode step ms | "
            + " | ".join(f"+{c} chunk" for c in chunks) + " |")
    lines = [head, "|---|---:|" + "---:|" * len(chunks)]
    for prof in loaded:
        alone = step_ms(prof, 0, decodes, context)
        cells = [f"{step_ms(prof, c, decodes, context):.0f} ms "
                 f"({inflation(prof, c, decodes, context):.1f}x)" for c in chunks]
        lines.append(f"| {prof.name} | {alone:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(profiles: Sequence[str] = DEFAULT_PROFILES, chunks: Sequence[int] = DEFAULT_CHUNKS,
           decodes: int = DEFAULT_DECODES, context: int = DEFAULT_DECODE_CONTEXT) -> str:
    return "\n".join([
        "Published mixed steps beside the emulated step (inflation = mixed / decode-only)", "",
        published_table(), "",
        f"Emulated inflation by chunk size: {decodes} decodes at {context} tokens of context "
        "plus one fresh prefill chunk", "",
        sweep_table(profiles, chunks, decodes, context)])
