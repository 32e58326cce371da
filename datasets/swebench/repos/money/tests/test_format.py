from decimal import Decimal

import pytest

from money import UnknownCurrency, format_money, quantize


def test_usd():
    assert format_money(Decimal("1234.5")) == "$1,234.50"
    assert format_money(Decimal("0.5")) == "$0.50"
    assert format_money(7) == "$7.00"


def test_grouping():
    assert format_money(Decimal("1234567.891")) == "$1,234,567.89"
    assert format_money(Decimal("999.99")) == "$999.99"
    assert format_money(Decimal("1000000"), grouping=False) == "$1000000.00"


def test_negative():
    assert format_money(Decimal("-1234.5")) == "-$1,234.50"


def test_euro_style():
    assert format_money(Decimal("-1234.5"), "EUR") == "-1.234,50 €"


def test_zero_decimal_currency():
    assert format_money(Decimal("1234"), "JPY") == "¥1,234"
    assert format_money(Decimal("1234.4"), "jpy") == "¥1,234"


def test_three_decimals_and_alpha_symbol():
    assert format_money(Decimal("12.3456"), "KWD") == "KD 12.346"
    assert format_money(Decimal("1234.5"), "CHF") == "CHF 1'234.50"


def test_without_symbol():
    assert format_money(Decimal("12"), "GBP", symbol=False) == "12.00"


def test_rounding_not_at_half():
    assert format_money(Decimal("10.001")) == "$10.00"
    assert format_money(Decimal("10.006")) == "$10.01"
    assert format_money(Decimal("-10.004")) == "-$10.00"


def test_quantize():
    assert quantize("2.349") == Decimal("2.35")
    assert quantize("2.341", "JPY") == Decimal("2")


def test_rejects_non_finite_and_unknown():
    with pytest.raises(ValueError):
        format_money(Decimal("NaN"))
    with pytest.raises(UnknownCurrency):
        format_money(1, "XYZ")
