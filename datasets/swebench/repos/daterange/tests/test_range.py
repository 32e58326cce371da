from datetime import date

import pytest

from daterange import DateRange


def test_len_contains_iter():
    r = DateRange(date(2024, 1, 30), date(2024, 2, 2))
    assert len(r) == 4
    assert date(2024, 2, 1) in r
    assert date(2024, 2, 3) not in r
    assert "2024-02-01" not in r
    assert list(r)[-1] == date(2024, 2, 2)


def test_days_with_step():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    assert [d.day for d in r.days(step=3)] == [1, 4, 7, 10]
    with pytest.raises(ValueError):
        list(r.days(step=0))


def test_end_before_start():
    with pytest.raises(ValueError):
        DateRange(date(2024, 1, 2), date(2024, 1, 1))


def test_overlap_and_intersection():
    a = DateRange(date(2024, 1, 1), date(2024, 1, 10))
    b = DateRange(date(2024, 1, 10), date(2024, 1, 20))
    c = DateRange(date(2024, 2, 1), date(2024, 2, 2))
    assert a.overlaps(b) and not a.overlaps(c)
    assert a.intersection(b) == DateRange(date(2024, 1, 10), date(2024, 1, 10))
    assert a.intersection(c) is None


def test_shift_and_str():
    r = DateRange(date(2024, 1, 1), date(2024, 1, 3)).shift(2)
    assert str(r) == "2024-01-03..2024-01-05"
    assert str(DateRange(date(2024, 1, 1), date(2024, 1, 1))) == "2024-01-01"
