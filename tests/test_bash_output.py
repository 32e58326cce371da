"""The bash tool's output capture and observation text, without Docker: the head and tail a
long output is cut to, the character counts in the marker, memory bounded for any length."""

from __future__ import annotations

from harness.tools.bash_output import HeadTailCapture, format_observation


def captured(head: int, tail: int, *chunks: bytes) -> tuple[str, int]:
    capture = HeadTailCapture(head, tail)
    for chunk in chunks:
        capture.add(chunk)
    return capture.text()


def test_short_output_is_kept_whole() -> None:
    assert captured(5, 5, b"hello\n") == ("hello\n", 0)
    assert captured(5, 5, b"") == ("", 0)
    assert captured(5, 5, b"0123456789") == ("0123456789", 0)  # exactly head + tail


def test_long_output_keeps_head_and_tail_with_a_marker() -> None:
    text, elided = captured(5, 5, b"abcde", b"XY", b"vwxyz")
    assert elided == 2
    assert text == ("abcde\n[... 2 characters elided: the output had 12 characters; "
                    "showing the first 5 and the last 5 ...]\nvwxyz")


def test_characters_not_bytes_are_counted() -> None:
    text, elided = captured(3, 3, ("é" * 7).encode())  # 7 characters, 14 bytes
    assert elided == 1
    assert text.startswith("ééé\n[... 1 characters elided: the output had 7 characters")
    assert text.endswith("...]\nééé")


def test_huge_output_stays_bounded_and_is_counted() -> None:
    capture = HeadTailCapture(10, 10)
    chunk = "€".encode() * 100_000  # 300 kB, cut mid-character at the head's end
    for _ in range(50):
        capture.add(chunk)
        assert len(capture.head) <= 40 and len(capture.tail) <= 2 * 40
    text, elided = capture.text()
    assert elided == 50 * 100_000 - 20
    assert text.startswith("€" * 10 + "\n[... ") and text.endswith("...]\n" + "€" * 10)
    assert "\ufffd" not in text


def test_no_tail() -> None:
    text, elided = captured(3, 0, b"x" * 1000)
    assert elided == 997 and text.startswith("xxx\n[... 997") and text.endswith("last 0 ...]\n")


def test_observation_text() -> None:
    assert format_observation(0, "hi\n", timed_out=False, timeout=60) == (
        "<returncode>0</returncode>\n<output>\nhi\n</output>")
    text = format_observation(None, "", timed_out=True, timeout=2.5, note="Gone.")
    assert text.startswith("<returncode>none</returncode>\n<output>\n</output>\n<warning>")
    assert "killed after 2.5 s" in text and text.endswith("<warning>Gone.</warning>")
