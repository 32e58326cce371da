"""What the agent sees of a command: the head and tail of its output, and the observation text.

A command may write gigabytes (``yes``, a runaway log); the agent's context takes a few
thousand characters.  ``HeadTailCapture`` keeps only the first and last bytes of a stream of
any length while it is read, so memory stays bounded, and counts its characters so the
observation can say how much was left out.  The observation text follows mini-swe-agent's
shape: return code and output, long outputs cut to their head and tail with a marker saying
how much was left out.

This is pure Python with no Docker in it, so it is tested on its own
(``tests/test_bash_output.py``).
"""

from __future__ import annotations

_CONT = bytes(range(0x80, 0xC0))  # UTF-8 continuation bytes: not the start of a character


class HeadTailCapture:
    """Keeps the first and last bytes of a stream of any length, and counts its characters."""

    def __init__(self, head_chars: int, tail_chars: int) -> None:
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.head_max = 4 * head_chars  # a UTF-8 character is at most 4 bytes
        self.tail_max = 4 * tail_chars
        self.head = bytearray()
        self.tail = bytearray()
        self.total_bytes = 0
        self.total_chars = 0  # characters = bytes that are not UTF-8 continuation bytes

    def add(self, data: bytes) -> None:
        self.total_bytes += len(data)
        self.total_chars += len(data.translate(None, _CONT))
        room = self.head_max - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.tail_max:  # trim now and then, not every chunk
                del self.tail[: len(self.tail) - self.tail_max]

    def text(self) -> tuple[str, int]:
        """The output as text, cut to head + marker + tail; and how many characters were cut."""
        if self.total_bytes <= self.head_max + self.tail_max:  # everything was kept
            full = bytes(self.head + self.tail).decode("utf-8", errors="replace")
            if len(full) <= self.head_chars + self.tail_chars:
                return full, 0
            head, tail = full[: self.head_chars], full[-self.tail_chars :]
            elided = len(full) - self.head_chars - self.tail_chars
        else:
            head = bytes(self.head).decode("utf-8", errors="replace")[: self.head_chars]
            tail_text = bytes(self.tail[-self.tail_max :]).decode("utf-8", errors="replace")
            tail = tail_text[-self.tail_chars :] if self.tail_chars else ""
            elided = max(self.total_chars - len(head) - len(tail), 1)
        marker = (
            f"\n[... {elided} characters elided: the output had {elided + len(head) + len(tail)}"
            f" characters; showing the first {len(head)} and the last {len(tail)} ...]\n"
        )
        return head + marker + tail, elided


def format_observation(
    exit_code: int | None, output: str, *, timed_out: bool, timeout: float, note: str = ""
) -> str:
    """The text the agent sees: return code, output, and a warning on timeout or truncation."""
    rc = "none" if exit_code is None else str(exit_code)
    parts = [f"<returncode>{rc}</returncode>", f"<output>\n{output}</output>"]
    if timed_out:
        parts.append(
            f"<warning>The command was killed after {timeout:g} s: it did not finish within "
            "the time limit. Use a shorter or non-interactive command, or run long jobs in "
            "the background with their output redirected to a file.</warning>"
        )
    if note:
        parts.append(f"<warning>{note}</warning>")
    return "\n".join(parts)
