import pytest

from csvsniff import Dialect, SniffError, sniff


def test_comma():
    assert sniff("a,b,c\n1,2,3\n4,5,6\n").delimiter == ","


def test_semicolon():
    assert sniff("name;age\nAda;36\nAlan;41\n").delimiter == ";"


def test_tab_and_pipe():
    assert sniff("x\ty\n1\t2\n").delimiter == "\t"
    assert sniff("x|y|z\n1|2|3\n").delimiter == "|"


def test_consistency_beats_frequency():
    sample = "id;note\n1;a,b,c\n2;d\n"
    assert sniff(sample).delimiter == ";"


def test_no_delimiter():
    with pytest.raises(SniffError):
        sniff("just one column\nand another line\n")
    with pytest.raises(SniffError):
        sniff("\n\n")


def test_header_detection():
    assert sniff("name,age\nAda,36\nAlan,41\n").has_header
    assert not sniff("Ada,36\nAlan,41\n").has_header
    assert not sniff("a,b\nc,d\n").has_header


def test_quotechar():
    assert sniff("'a','b'\n'c','d'\n").quotechar == "'"
    assert sniff('"a","b"\n"c","d"\n').quotechar == '"'


def test_line_terminator():
    assert sniff("a,b\r\n1,2\r\n").line_terminator == "\r\n"
    assert sniff("a,b\n1,2\n").line_terminator == "\n"


def test_dialect_defaults():
    assert Dialect(",") == Dialect(",", '"', False, "\n")
