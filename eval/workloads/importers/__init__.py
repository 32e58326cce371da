"""Benchmark traces from recorded agent runs: mini-swe-agent, SWE-agent and our own harness.

Each importer turns one trajectory (already parsed JSON) into one :class:`common.trace.Program`
with the accounting of :mod:`common.trace`: turn ``i`` is the ``i``-th model call; what the model
wrote is its ``output_tokens``; what came back before the next call is its
``tool_return_tokens``; the last model call ends the program (whatever ran after it, e.g. the
``submit`` command, is dropped: no model call follows it).

One module per format (`mini_swe_agent`, `swe_agent`, `harness_trajectory`, `claude_code`),
each giving the registry (`formats.FORMATS`) its importer and detector; what they share (token
counts of recorded text with our chat template's framing, message text, checks) is `shared`,
and reading files into programs and traces is `files`. Recorded text is counted with the project's
tokenizer unless ``count_tokens=`` is given (`shared` says how); our own harness records the
server's exact ``prompt_tokens`` / ``output_tokens``, so :func:`from_harness_trajectory` needs
no tokenizer, nor do Claude Code sessions (`claude_code`: kv-cache-tester's records, whose
token counts and block hashes say each prompt; one session file is the session's program and
one per sub-agent, `import_file_programs`).
"""

from __future__ import annotations

from eval.workloads.importers.claude_code import (
    check_round_trip,
    from_claude_code,
    programs_from_claude_code,
)
from eval.workloads.importers.files import import_file, import_file_programs, trace_from_files
from eval.workloads.importers.formats import (
    FORMATS,
    detect_format,
    import_programs,
    import_trajectory,
)
from eval.workloads.importers.harness_trajectory import from_harness_trajectory
from eval.workloads.importers.mini_swe_agent import from_mini_swe_agent
from eval.workloads.importers.shared import (
    TOKENIZER_DIR,
    Format,
    TokenCounter,
    local_token_counter,
    message_text,
)
from eval.workloads.importers.swe_agent import from_swe_agent

__all__ = [
    "FORMATS",
    "TOKENIZER_DIR",
    "Format",
    "TokenCounter",
    "check_round_trip",
    "detect_format",
    "from_claude_code",
    "from_harness_trajectory",
    "from_mini_swe_agent",
    "from_swe_agent",
    "import_file",
    "import_file_programs",
    "import_programs",
    "import_trajectory",
    "local_token_counter",
    "message_text",
    "programs_from_claude_code",
    "trace_from_files",
]
