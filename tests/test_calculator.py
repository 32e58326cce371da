"""The calculator tool: GSM8K-style input, exact arithmetic, formatting, hostile input refused."""

from __future__ import annotations

import asyncio
import builtins

import pytest

from harness.tools.calculator import Calculator, CalculatorError, evaluate, format_number


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 - 10", "-3"),
        ("-(3 + 4)", "-7"),
        ("+5", "5"),
        ("48 / 2", "24"),
        ("10 / 4", "2.5"),
        ("10 / 3", "3.333333"),
        ("2 / 3", "0.666667"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -2", "0.25"),
        ("0.1 + 0.2", "0.3"),
        ("0.1 * 3", "0.3"),
        ("1.5 * 4", "6"),
        ("3.75 + 1.25", "5"),
        # GSM8K notation
        ("1,234 + 766", "2000"),
        ("1,234,567 - 1", "1234566"),
        ("1,234.5 * 2", "2469"),
        ("$1,200 / 4", "300"),
        ("$12.50 * 3", "37.5"),
        ("15% * 80", "12"),
        ("80 * 15%", "12"),
        ("50%", "0.5"),
        ("(3 + 2)%", "0.05"),
        ("12.5% * 200", "25"),
        ("3 x 4", "12"),
        ("3x4", "12"),
        ("2 × 3.5", "7"),
        ("12 ÷ 4", "3"),
        ("5 − 2", "3"),
        ("2^10", "1024"),
        ("3 x (2 + 1)", "9"),
        ("10 x sqrt(4)", "20"),
        ("12 * 4 =", "48"),
        ("`6 * 7`", "42"),
        # functions
        ("abs(-3.5)", "3.5"),
        ("round(2.567, 2)", "2.57"),
        ("round(7.5)", "8"),
        ("min(4, 9, 2)", "2"),
        ("max(4, 9, 2)", "9"),
        ("sqrt(144)", "12"),
        ("sqrt(2)", "1.414214"),
        ("sqrt(9/4)", "1.5"),
        ("floor(7 / 2)", "3"),
        ("ceil(7 / 2)", "4"),
        ("2 ** 0.5", "1.414214"),
        ("1.5e3", "1500"),
        ("10 ** 20", "100000000000000000000"),
    ],
)
def test_evaluate(expr: str, expected: str) -> None:
    assert evaluate(expr) == expected


def test_modulo_and_percent_are_told_apart() -> None:
    assert evaluate("20 % 6") == "2"  # an operand follows: modulo
    assert evaluate("20% + 6") == "6.2"  # an operator follows: percent
    assert evaluate("200 * 20%") == "40"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (42.0, "42"),
        (2.50, "2.5"),
        (1 / 3, "0.333333"),
        (-0.0, "0"),
        (1e-9, "1e-09"),
        (1e20, "1e+20"),
        (123456.7890004, "123456.789"),
    ],
)
def test_format_number(value: float, text: str) -> None:
    assert format_number(value) == text


def test_integer_results_never_print_point_zero() -> None:
    for expr in ("4.0 * 2.5", "1e2", "9 / 3", "sqrt(16)", "0.5 + 0.5", "floor(2.7)"):
        assert "." not in evaluate(expr), expr


HOSTILE = [
    "__import__('os').system('id')",
    "().__class__",
    "().__class__.__bases__[0].__subclasses__()",
    "(1).__class__",
    "lambda: 1",
    "(lambda x: x)(1)",
    "x",
    "x + 1",
    "os",
    "open('/etc/passwd')",
    "eval('1+1')",
    "exec('1')",
    "print(1)",
    "pow(2, 3)",
    "'a' * 3",
    "'abc' + 'd'",
    "[1, 2][0]",
    "[i for i in range(3)]",
    "{1: 2}",
    "(1, 2)",
    "1 if 1 else 2",
    "1 < 2",
    "1 and 2",
    "True + 1",
    "None",
    "(y := 3)",
    "max(*[1, 2])",
    "round(2.5, ndigits=1)",
    "9**9**9",
    "10 ** 10000",
    "2 ** 5000",
    "99999 ** 999",
    "(10 ** 100) ** 5",
    "10 ** 101 * 10 ** 300",
    "1" + "0" * 101,
    "1e400",
    "1e-999999999",
    "2 ** 3.5e300",
    "1 / 0",
    "5 // 0",
    "5 % 0",
    "0 ** -1",
    "(-8) ** 0.5",
    "sqrt(-1)",
    "1 +",
    "",
    "   ",
    "1" * 501,
]


@pytest.mark.parametrize("expr", HOSTILE)
def test_hostile_or_invalid_input_is_refused(expr: str) -> None:
    with pytest.raises(CalculatorError) as info:
        evaluate(expr)
    assert str(info.value)


@pytest.mark.parametrize("expr", ["__import__('os').system('id')", "9**9**9", "().__class__"])
def test_tool_returns_error_observation(expr: str) -> None:
    observation = asyncio.run(Calculator().run(expr))
    assert observation.ok is False
    assert observation.text.startswith("Error: ")
    assert observation.done is False


def test_nothing_is_executed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "pwned"
    calls: list[str] = []

    def trap(name: str):
        def refuse(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"{name} called")

        return refuse

    monkeypatch.setattr(builtins, "eval", trap("eval"))
    monkeypatch.setattr(builtins, "exec", trap("exec"))
    attack = f"__import__('os').system('touch {marker}')"
    observation = asyncio.run(Calculator().run(attack))
    assert observation.ok is False
    assert not marker.exists()
    assert calls == []


@pytest.mark.parametrize("expr", ["(" * 240 + "1" + ")" * 240, "-" * 499 + "1", "2" + "**2" * 160])
def test_deep_nesting_gives_a_result_or_an_error_never_a_crash(expr: str) -> None:
    try:
        evaluate(expr)
    except CalculatorError:
        pass


def test_error_messages_say_what_to_do() -> None:
    with pytest.raises(CalculatorError, match="division by zero"):
        evaluate("3 / (2 - 2)")
    with pytest.raises(CalculatorError, match="exponent"):
        evaluate("9**9**9")
    with pytest.raises(CalculatorError, match="names not allowed"):
        evaluate("apples * 3")
    with pytest.raises(CalculatorError, match="at most 500"):
        evaluate("1+" * 300 + "1")
    with pytest.raises(CalculatorError, match="thousands separator"):
        evaluate("max(1,234)")  # read as max(1234): one argument


def test_tool_success_observation() -> None:
    observation = asyncio.run(Calculator().run("(1,200 - 15% * 80) / 4"))
    assert observation.ok is True
    assert observation.text == "297"
    assert observation.info["expression"] == "(1,200 - 15% * 80) / 4"
    assert Calculator.name == "calculator"


def test_tool_closes_cleanly() -> None:
    async def use() -> str:
        async with Calculator() as calculator:
            observation = await calculator.run("6 * 7")
        await calculator.aclose()
        return observation.text

    assert asyncio.run(use()) == "42"
