"""Turn configuration text into a :class:`~iniconf.config.Config`."""

from __future__ import annotations

import os
import re

from .config import DEFAULT_SECTION, Config, ConfigError

_SECTION_RE = re.compile(r"\[\s*(?P<name>[^\]]+?)\s*\]")
_OPTION_RE = re.compile(r"(?P<key>[^=:\s][^=:]*?)\s*[=:]\s*(?P<value>.*)")
_COMMENT_CHARS = "#;"


def _strip_inline_comment(value: str) -> str:
    for marker in _COMMENT_CHARS:
        value = value.split(marker, 1)[0]
    return value.rstrip()


def parse(text: str, *, source: str = "<string>") -> Config:
    """Parse INI text; errors mention ``source`` and the line number."""
    config = Config()
    section = config.add_section(DEFAULT_SECTION)
    last_key: str | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped[0] in _COMMENT_CHARS:
            continue
        if raw[0].isspace() and last_key is not None:
            section[last_key] += "\n" + _strip_inline_comment(stripped)
            continue
        header = _SECTION_RE.fullmatch(stripped)
        if header:
            section = config.add_section(header["name"])
            last_key = None
            continue
        option = _OPTION_RE.fullmatch(stripped)
        if option is None:
            raise ConfigError(f"{source}:{number}: expected 'key = value', got {stripped!r}")
        last_key = option["key"].strip().lower()
        section[last_key] = _strip_inline_comment(option["value"])
    return config


def load(path: str | os.PathLike[str], *, encoding: str = "utf-8") -> Config:
    with open(path, encoding=encoding) as handle:
        return parse(handle.read(), source=os.fspath(path))
