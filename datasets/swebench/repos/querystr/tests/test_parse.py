import pytest

from querystr import QueryError, parse, parse_pairs, unquote


def test_simple():
    assert parse("a=1&b=2") == {"a": ["1"], "b": ["2"]}


def test_repeated_keys_and_order():
    assert parse("?tag=x&id=7&tag=y") == {"tag": ["x", "y"], "id": ["7"]}


def test_semicolon_separator():
    assert parse("a=1;b=2") == {"a": ["1"], "b": ["2"]}


def test_plus_is_space():
    assert parse("q=hello+world") == {"q": ["hello world"]}


def test_percent_utf8():
    assert parse("city=S%C3%A3o%20Paulo") == {"city": ["São Paulo"]}


def test_plus_and_escapes_together():
    assert parse("q=caf%C3%A9+au+lait") == {"q": ["café au lait"]}


def test_blank_values():
    assert parse("a=&b") == {}
    assert parse("a=&b", keep_blank=True) == {"a": [""], "b": [""]}


def test_invalid_escapes():
    assert unquote("100%") == "100%"
    assert unquote("%zz") == "%zz"
    with pytest.raises(QueryError):
        unquote("%zz", strict=True)
    with pytest.raises(QueryError):
        parse("novalue", strict=True)


def test_invalid_utf8_replaced():
    assert unquote("%FF") == "\ufffd"


def test_pairs_keep_order():
    assert parse_pairs("b=2&a=1&b=3") == [("b", "2"), ("a", "1"), ("b", "3")]


def test_unquote_without_plus():
    assert unquote("a+b", plus_is_space=False) == "a+b"
