import pytest

from wraptext import fill, fill_paragraphs, wrap

TEXT = "The quick brown fox jumps over the lazy dog"


def test_short_text_single_line():
    assert wrap("hello world", 40) == ["hello world"]


def test_empty_text():
    assert wrap("", 10) == []
    assert wrap("   \n\t ", 10) == []


def test_whitespace_collapsed():
    assert wrap("a \t b\n\nc", 40) == ["a b c"]


def test_lines_never_exceed_width():
    for width in range(5, 40):
        for line in wrap(TEXT * 3, width):
            assert len(line) <= width


def test_no_words_lost():
    for width in (8, 13, 21):
        assert " ".join(wrap(TEXT, width)).split() == TEXT.split()


def test_greedy_lines():
    assert wrap(TEXT, 16) == ["The quick brown", "fox jumps over", "the lazy dog"]


def test_long_words_are_broken():
    assert wrap("abcdefghijkl xyz", 5) == ["abcde", "fghij", "kl", "xyz"]


def test_long_words_kept_when_asked():
    assert wrap("abcdefghijkl xy", 5, break_long_words=False) == ["abcdefghijkl", "xy"]


def test_indents():
    lines = wrap(TEXT, 15, indent="* ", subsequent_indent="  ")
    assert lines == ["* The quick", "  brown fox", "  jumps over", "  the lazy dog"]


def test_indent_too_wide():
    with pytest.raises(ValueError):
        wrap(TEXT, 4, indent="    ")


def test_fill_and_paragraphs():
    assert fill("one two three", 8) == "one two\nthree"
    text = "one two three\n\n\nfour five"
    assert fill_paragraphs(text, 8) == "one two\nthree\n\nfour\nfive"
