import pytest

from wraptext import dedent_lines, shorten


def test_shorten_fits():
    assert shorten("Hello   world", 20) == "Hello world"


def test_shorten_cuts_at_word():
    assert shorten("Hello there, general Kenobi", 18) == "Hello there, [...]"


def test_shorten_nothing_fits():
    assert shorten("Supercalifragilistic", 8) == "[...]"


def test_shorten_placeholder_too_large():
    with pytest.raises(ValueError):
        shorten("Hello world", 3)


def test_dedent_lines():
    assert dedent_lines("    a\n      b\n\n    c") == "a\n  b\n\nc"
