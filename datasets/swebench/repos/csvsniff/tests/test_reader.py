from csvsniff import Dialect, read_rows, sniff
from csvsniff.reader import split_line


def test_split_plain():
    assert split_line("a,b,,c", ",") == ["a", "b", "", "c"]


def test_split_quoted_delimiter():
    assert split_line('"a,b",c', ",") == ["a,b", "c"]


def test_split_doubled_quote():
    assert split_line('"say ""hi""",x', ",") == ['say "hi"', "x"]


def test_read_rows_with_sniffed_dialect():
    text = "city|pop\nOslo|709000\nBergen|291000\n"
    assert read_rows(text, sniff(text)) == [
        ["city", "pop"], ["Oslo", "709000"], ["Bergen", "291000"],
    ]


def test_read_rows_skips_blank_lines():
    assert read_rows("a;b\n\n1;2\n", Dialect(";")) == [["a", "b"], ["1", "2"]]
