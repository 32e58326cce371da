"""The front page and docs/ hold together: every relative link resolves, every doc is in the index.

README.md is a front door (at most 250 lines) that links docs/README.md, the index; the index
links every doc under docs/ directly. A relative link must name an existing file or folder and,
with `#anchor`, a heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces to hyphens, `-1`, `-2` for repeats). Links and headings inside fenced code are ignored,
so every fence must be closed.
Pure text reading: no marker, well under a second.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
INDEX = DOCS / "README.md"
MAX_README_LINES = 250

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def _prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(path):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link and image in the file's prose."""
    return [(number, m.group(1)) for number, line in _prose_lines(path)
            for m in _LINK.finditer(line)]


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def broken_links(path: Path) -> list[str]:
    """What is wrong with each relative link of one file, as `file:line: target (why)`."""
    problems = []
    for number, target in links(path):
        if _EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md" and resolved.is_file() \
                and unquote(anchor).lower() not in anchors(resolved):
            problems.append(f"{where} (no heading with anchor #{anchor} in "
                            f"{resolved.relative_to(ROOT)})")
    return problems


def test_every_relative_link_resolves():
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    doc = tmp_path / "doc.md"
    (tmp_path / "other.md").write_text("# A heading: `with code`\n\n## Again\n## Again\n")
    doc.write_text("[ok](other.md#a-heading-with-code) [ok](other.md#again-1) [ok](#here)\n"
                   "# Here\n[gone](missing.md)\n[bad anchor](other.md#nowhere)\n"
                   "```\n[in code](missing-too.md)\n```\n[web](https://example.com/x.md)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = broken_links(doc)
    finally:
        ROOT = saved
    assert problems == ["doc.md:3: missing.md (no such file)",
                        "doc.md:4: other.md#nowhere (no heading with anchor #nowhere in other.md)"]


def unclosed_fence(path: Path) -> int | None:
    """The line of a code fence the file never closes (the rest would hide its links), or None."""
    opened = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if _FENCE.match(line):
            opened = None if opened else number
    return opened


def test_every_code_fence_is_closed():
    unclosed = [f"{path.relative_to(ROOT)}:{unclosed_fence(path)}" for path in markdown_files()
                if unclosed_fence(path)]
    assert not unclosed, "code fence opened and never closed: " + ", ".join(unclosed)


def test_the_index_links_every_doc():
    linked = {(INDEX.parent / unquote(t.partition("#")[0])).resolve()
              for _, t in links(INDEX) if not _EXTERNAL.match(t) and t.partition("#")[0]}
    docs = {p.resolve() for p in DOCS.rglob("*.md") if p.resolve() != INDEX.resolve()}
    missing = sorted(str(p.relative_to(ROOT)) for p in docs - linked)
    assert not missing, f"docs/README.md (the index) does not link: {', '.join(missing)}"


def test_readme_is_a_front_door_that_links_the_index():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; at most {MAX_README_LINES}: move detail to docs/")
    targets = {(ROOT / unquote(t.partition("#")[0])).resolve() for _, t in links(README)
               if not _EXTERNAL.match(t) and t.partition("#")[0]}
    assert INDEX.resolve() in targets, "README.md does not link docs/README.md"
