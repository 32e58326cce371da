from decimal import Decimal

import pytest

from money import format_money, parse_money, split_evenly


def test_parse_usd():
    assert parse_money("$1,234.50") == (Decimal("1234.50"), "USD")


def test_parse_negative_and_parentheses():
    assert parse_money("-$12.00") == (Decimal("-12.00"), "USD")
    assert parse_money("($12.00)") == (Decimal("-12.00"), "USD")


def test_parse_euro_and_code():
    assert parse_money("1.234,50 €") == (Decimal("1234.50"), "EUR")
    assert parse_money("CHF 1'234.50") == (Decimal("1234.50"), "CHF")


def test_parse_rejects_garbage():
    with pytest.raises(ValueError):
        parse_money("twelve dollars")


def test_round_trip():
    for text in ["0.01", "5", "1234.56", "-99.99", "1000000"]:
        amount = Decimal(text)
        assert parse_money(format_money(amount))[0] == amount


def test_split_evenly():
    assert split_evenly(Decimal("10.00"), 3) == [Decimal("3.34"), Decimal("3.33"), Decimal("3.33")]
    assert sum(split_evenly(Decimal("-0.05"), 2)) == Decimal("-0.05")
    assert split_evenly(100, 4, "JPY") == [25, 25, 25, 25]
    with pytest.raises(ValueError):
        split_evenly(1, 0)
