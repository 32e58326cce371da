from datetime import date

import pytest

from daterange import DateRangeError, parse_period, parse_range


def test_single_day():
    r = parse_range("2024-03-05")
    assert r.start == r.end == date(2024, 3, 5)


def test_months():
    assert parse_range("2024-01") == parse_range("2024-01-01..2024-01-31")
    assert len(parse_range("2024-04")) == 30


def test_leap_february():
    assert parse_range("2024-02").end == date(2024, 2, 29)
    assert parse_range("2023-02").end == date(2023, 2, 28)


def test_quarters():
    q2 = parse_range("2024-Q2")
    assert (q2.start, q2.end) == (date(2024, 4, 1), date(2024, 6, 30))
    assert parse_range("2024-q1").end == date(2024, 3, 31)


def test_year():
    r = parse_range(" 2023 ")
    assert (r.start, r.end, len(r)) == (date(2023, 1, 1), date(2023, 12, 31), 365)


def test_explicit_range_uses_start_and_end_of_sides():
    r = parse_range("2024-01..2024-03-15")
    assert (r.start, r.end) == (date(2024, 1, 1), date(2024, 3, 15))
    r = parse_range("2024-02-10..2024-Q2")
    assert r.end == date(2024, 6, 30)


def test_span():
    r = parse_range("2024-02-27+5")
    assert (r.start, r.end) == (date(2024, 2, 27), date(2024, 3, 2))


def test_errors():
    for text in ["2024-13", "2024-02-30", "2024-Q5", "soon", "2024-05..", "2024-05..2024-04",
                 "2024-01-01+0"]:
        with pytest.raises(DateRangeError):
            parse_range(text)


def test_parse_period_rejects_ranges():
    with pytest.raises(DateRangeError):
        parse_period("2024-01..2024-02")
