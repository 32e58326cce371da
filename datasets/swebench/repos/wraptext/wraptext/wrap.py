"""Wrap text into lines of at most ``width`` characters.

Whitespace (spaces, tabs, newlines) between words is collapsed to one space.
Lines are filled greedily: a word goes on the current line when it fits.
"""

from __future__ import annotations

import re

_WORD_RE = re.compile(r"\S+")


def _split_long(word: str, room: int) -> list[str]:
    return [word[i:i + room] for i in range(0, len(word), room)]


def wrap(
    text: str,
    width: int = 70,
    *,
    indent: str = "",
    subsequent_indent: str | None = None,
    break_long_words: bool = True,
) -> list[str]:
    """Return the lines of ``text`` wrapped to ``width`` columns.

    ``indent`` starts the first line and ``subsequent_indent`` (default: the
    same as ``indent``) every other line; both count towards ``width``.
    """
    if subsequent_indent is None:
        subsequent_indent = indent
    if width <= max(len(indent), len(subsequent_indent)):
        raise ValueError(f"width {width} leaves no room after the indent")
    words = _WORD_RE.findall(text)
    lines: list[str] = []
    current: list[str] = []
    length = 0  # characters on the current line, indent and separating spaces included

    def prefix() -> str:
        return indent if not lines else subsequent_indent

    def flush() -> None:
        nonlocal current, length
        if current:
            lines.append(prefix() + " ".join(current))
        current, length = [], 0

    for word in words:
        if not current:
            length = len(prefix())
        room = width - length - (1 if current else 0)
        if len(word) < room:
            current.append(word)
            length += len(word) + (1 if len(current) > 1 else 0)
            continue
        flush()
        length = len(prefix())
        room = width - length
        if len(word) > room and break_long_words:
            pieces = _split_long(word, room)
            for piece in pieces[:-1]:
                lines.append(prefix() + piece)
            word = pieces[-1]
            length = len(prefix())
        current.append(word)
        length += len(word)
    flush()
    return lines


def fill(text: str, width: int = 70, **options: object) -> str:
    """``wrap`` joined with newlines."""
    return "\n".join(wrap(text, width, **options))  # type: ignore[arg-type]


def fill_paragraphs(text: str, width: int = 70, **options: object) -> str:
    """Wrap each blank-line-separated paragraph on its own; keep one blank line between."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(fill(p, width, **options) for p in paragraphs)


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """Collapse whitespace and cut ``text`` at a word boundary to fit ``width``."""
    words = _WORD_RE.findall(text)
    collapsed = " ".join(words)
    if len(collapsed) <= width:
        return collapsed
    if len(placeholder.lstrip()) > width:
        raise ValueError("placeholder too large for width")
    kept: list[str] = []
    for word in words:
        candidate = " ".join([*kept, word])
        if len(candidate) + len(placeholder) > width:
            break
        kept.append(word)
    if not kept:
        return placeholder.lstrip()
    return " ".join(kept) + placeholder


def dedent_lines(text: str) -> str:
    """Remove the indentation common to all non-blank lines."""
    lines = text.splitlines()
    indents = [len(line) - len(line.lstrip()) for line in lines if line.strip()]
    cut = min(indents, default=0)
    return "\n".join(line[cut:] if line.strip() else "" for line in lines)
