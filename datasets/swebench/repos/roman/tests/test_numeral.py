import pytest

from roman import Roman, RomanError


def test_construct_from_str_and_int():
    assert Roman("XIV") == Roman(14) == 14


def test_str_and_repr():
    assert str(Roman(9)) == "IX"
    assert repr(Roman(2024)) == "Roman('MMXXIV')"


def test_arithmetic_stays_roman():
    total = Roman(9) + Roman(5)
    assert isinstance(total, Roman)
    assert str(total) == "XIV"
    assert str(Roman(10) - 1) == "IX"
    assert str(3 * Roman(7)) == "XXI"


def test_out_of_range_results():
    with pytest.raises(RomanError):
        Roman(5) - 5
    with pytest.raises(RomanError):
        Roman(2000) * 2
