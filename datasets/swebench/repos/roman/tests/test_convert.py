import pytest

from roman import RomanError, from_roman, is_roman, to_roman


def test_small_numbers():
    assert [to_roman(n) for n in range(1, 11)] == [
        "I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X",
    ]


def test_subtractive_pairs():
    assert to_roman(40) == "XL"
    assert to_roman(90) == "XC"
    assert to_roman(400) == "CD"
    assert to_roman(900) == "CM"


def test_known_years():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(2024) == "MMXXIV"
    assert to_roman(3888) == "MMMDCCCLXXXVIII"


def test_zero_and_negative_rejected():
    with pytest.raises(RomanError):
        to_roman(0)
    with pytest.raises(RomanError):
        to_roman(-5)


def test_rejects_4000():
    with pytest.raises(RomanError, match=r"1\.\.3999"):
        to_roman(4000)


def test_non_int_rejected():
    with pytest.raises(TypeError):
        to_roman(2.0)
    with pytest.raises(TypeError):
        to_roman(True)


def test_from_roman_basic():
    assert from_roman("XIV") == 14
    assert from_roman(" mcmxciv ") == 1994
    assert from_roman("MMMCMXCIX") == 3999


def test_from_roman_strict():
    with pytest.raises(RomanError):
        from_roman("IIII")
    with pytest.raises(RomanError):
        from_roman("IC")
    assert from_roman("IIII", strict=False) == 4


def test_from_roman_bad_characters():
    with pytest.raises(RomanError, match="non-Roman"):
        from_roman("X1V")
    with pytest.raises(RomanError):
        from_roman("   ")


def test_round_trip_below_3000():
    for number in range(1, 3000):
        assert from_roman(to_roman(number)) == number


def test_is_roman():
    assert is_roman("XLII")
    assert not is_roman("XLIIII")
    assert not is_roman("")
