"""A safe arithmetic calculator for GSM8K-style agents.

The expression is parsed with :mod:`ast` and evaluated by walking the tree against a whitelist:
numbers, ``+ - * / // % **``, unary ``+``/``-``, parentheses and the functions ``abs``,
``round``, ``min``, ``max``, ``sqrt``, ``floor`` and ``ceil``. Anything else (names, attributes,
subscripts, strings, lambdas, comprehensions, other calls) is refused; nothing is ever passed to
``eval``. Arithmetic is exact where it can be (:class:`fractions.Fraction`, so ``0.1 * 3`` is
``0.3``), and falls back to floats only for irrational results (``sqrt(2)``, ``2 ** 0.5``).

Bounds keep hostile input cheap: at most 500 characters, literals up to ``10**100``, exponents
up to 1000 in magnitude, and no intermediate value with more than 400 digits.

Input written the way word problems write numbers is accepted: ``1,234`` (thousands
separators), ``$5``, ``15%`` (meaning 15/100), ``3 x 4`` / ``3 × 4`` (multiplication),
``2^10`` (power), ``÷`` and the Unicode minus sign. Results are printed as GSM8K answers are:
integers without ``.0``, other values rounded to 6 decimals with trailing zeros stripped.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from fractions import Fraction

from harness.tools.base import Observation, Tool

MAX_LENGTH = 500
MAX_LITERAL = 10**100
MAX_EXPONENT = 1000
MAX_DIGITS = 400
DECIMALS = 6

Number = Fraction | float

FUNCTIONS = ("abs", "round", "min", "max", "sqrt", "floor", "ceil")


class CalculatorError(ValueError):
    """The expression cannot be evaluated; the message says why and what to write instead."""


# --------------------------------------------------------------------------- preprocessing

_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:,\d{3})+(?![\d])")
_TIMES = re.compile(
    r"([\d.)%])\s*[xX×]\s*(?=[\d.(]|(?:" + "|".join(FUNCTIONS) + r")\s*\()"
)
_CURRENCY = re.compile(r"[$€£]")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)$")


def _normalize(expr: str) -> str:
    """Rewrite word-problem notation into the Python subset the evaluator reads."""
    text = expr.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "`'\"":
        text = text[1:-1].strip()
    text = text.rstrip("=").strip()
    text = text.replace("−", "-").replace("÷", "/").replace("·", "*")
    text = _CURRENCY.sub("", text)
    text = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), text)
    text = _TIMES.sub(r"\1*", text)
    text = text.replace("^", "**")
    return _percent(text)


def _percent(text: str) -> str:
    """`15%` -> `(15/100)`; a `%` between two operands (`7 % 3`) stays the modulo operator."""
    out = text
    i = 0
    while True:
        i = out.find("%", i)
        if i < 0:
            return out
        rest = out[i + 1:].lstrip()
        before = out[:i].rstrip()
        is_percent = before != "" and (rest == "" or rest[0] in ")+-*/,%")
        if not is_percent:
            i += 1
            continue
        start = _operand_start(before)
        if start is None:
            i += 1
            continue
        replaced = before[:start] + "(" + before[start:] + "/100)"
        out = replaced + out[i + 1:]
        i = len(replaced)


def _operand_start(before: str) -> int | None:
    """Where the operand ending at the end of `before` starts (a number or a bracketed group)."""
    end = len(before)
    if before[-1] == ")":
        depth = 0
        for j in range(end - 1, -1, -1):
            if before[j] == ")":
                depth += 1
            elif before[j] == "(":
                depth -= 1
                if depth == 0:
                    k = j
                    while k > 0 and (before[k - 1].isalpha() or before[k - 1] == "_"):
                        k -= 1
                    return k
        return None
    j = end
    while j > 0 and (before[j - 1].isdigit() or before[j - 1] == "."):
        j -= 1
    return j if j < end else None


# --------------------------------------------------------------------------- evaluation

def _check(value: Number) -> Number:
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("the result is too large (overflow)")
        return value
    if _digits(value.numerator) > MAX_DIGITS or _digits(value.denominator) > MAX_DIGITS:
        raise CalculatorError(f"the result is too large (more than {MAX_DIGITS} digits)")
    return value


def _digits(n: int) -> int:
    n = abs(n)
    return 1 if n == 0 else int(n.bit_length() * 0.30103) + 1


def _as_int(value: Number, what: str) -> int:
    if isinstance(value, Fraction) and value.denominator == 1:
        return value.numerator
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise CalculatorError(f"{what} must be a whole number, got {format_number(value)}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1 or (
        isinstance(exponent, float) and exponent.is_integer()
    ):
        e = _as_int(exponent, "the exponent")
        if abs(e) > MAX_EXPONENT:
            raise CalculatorError(
                f"the exponent {e} is too large (at most {MAX_EXPONENT} in magnitude)"
            )
        if base == 0 and e < 0:
            raise CalculatorError("division by zero (0 raised to a negative power)")
        if isinstance(base, Fraction):
            for part in (base.numerator, base.denominator):
                if part != 0 and math.log10(abs(part)) * abs(e) > MAX_DIGITS:
                    raise CalculatorError(
                        f"the result is too large (more than {MAX_DIGITS} digits)"
                    )
            return _check(base**e)
        try:
            return _check(float(base) ** e)
        except OverflowError:
            raise CalculatorError("the result is too large (overflow)") from None
    if base < 0:
        raise CalculatorError("a negative number has no real fractional power")
    try:
        return _check(float(base) ** float(exponent))
    except OverflowError:
        raise CalculatorError("the result is too large (overflow)") from None


def _divide(a: Number, b: Number, op: str) -> Number:
    if b == 0:
        raise CalculatorError("division by zero")
    if op == "/":
        return _check(a / b)
    result = a // b if op == "//" else a % b
    return _check(Fraction(result) if isinstance(result, int) else result)


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise CalculatorError("sqrt of a negative number")
    if isinstance(x, Fraction):
        n, d = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if n * n == x.numerator and d * d == x.denominator:
            return Fraction(n, d)
    try:
        return _check(math.sqrt(x))
    except OverflowError:
        raise CalculatorError("the number is too large for sqrt") from None


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return Fraction(round(x))
    nd = _as_int(ndigits, "round's second argument")
    if abs(nd) > 100:
        raise CalculatorError("round's second argument must be between -100 and 100")
    result = round(x, nd)
    return result if isinstance(result, float) else Fraction(result)


def _extreme(pick: Callable[..., Number], name: str) -> Callable[..., Number]:
    def apply(*args: Number) -> Number:
        if len(args) < 2:
            raise CalculatorError(
                f"{name}() needs at least 2 arguments, written {name}(a, b) with a space after "
                "each comma (a comma between digits, as in 5,100, is a thousands separator)"
            )
        return pick(args)

    return apply


_CALLS: dict[str, tuple[Callable[..., Number], int, int]] = {
    "abs": (lambda x: abs(x), 1, 1),
    "round": (_round, 1, 2),
    "min": (_extreme(min, "min"), 0, 64),
    "max": (_extreme(max, "max"), 0, 64),
    "sqrt": (_sqrt, 1, 1),
    "floor": (lambda x: Fraction(math.floor(x)), 1, 1),
    "ceil": (lambda x: Fraction(math.ceil(x)), 1, 1),
}

_BINARY: dict[type[ast.operator], str] = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
    ast.Mod: "%", ast.Pow: "**",
}

_REFUSED: dict[type[ast.AST], str] = {
    ast.Name: "names", ast.Attribute: "attribute access", ast.Subscript: "subscripts",
    ast.Lambda: "lambda", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "comprehensions",
    ast.Compare: "comparisons", ast.BoolOp: "boolean operators", ast.IfExp: "conditionals",
    ast.Tuple: "tuples (a comma outside a function call)", ast.List: "lists",
    ast.Dict: "dicts", ast.Set: "sets", ast.JoinedStr: "strings", ast.NamedExpr: "assignment",
    ast.Starred: "starred arguments", ast.Await: "await", ast.Yield: "yield",
}


class _Evaluator:
    def __init__(self, source: str) -> None:
        self.source = source

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            return self.constant(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            op = _BINARY[type(node.op)]
            left = self.eval(node.left)
            right = self.eval(node.right)
            if op == "+":
                return _check(left + right)
            if op == "-":
                return _check(left - right)
            if op == "*":
                return _check(left * right)
            if op == "**":
                return _power(left, right)
            return _divide(left, right, op)
        if isinstance(node, ast.Call):
            return self.call(node)
        what = _REFUSED.get(type(node), type(node).__name__)
        if isinstance(node, ast.UnaryOp | ast.BinOp):
            what = f"the operator {type(node.op).__name__}"
        raise CalculatorError(f"{what} not allowed: use numbers, + - * / // % ** and "
                              f"{', '.join(FUNCTIONS)}")

    def constant(self, node: ast.Constant) -> Number:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "strings" if isinstance(value, str | bytes) else type(value).__name__
            raise CalculatorError(f"{kind} not allowed: the calculator takes numbers only")
        segment = ast.get_source_segment(self.source, node) or repr(value)
        exponent = _EXPONENT.search(segment)
        if isinstance(value, float) and (
            not math.isfinite(value) or (exponent and abs(int(exponent.group(1))) > MAX_DIGITS)
        ):
            raise CalculatorError(f"the number {segment[:40]} is out of range")
        try:
            number: Number = Fraction(segment.replace("_", ""))
        except ValueError:
            number = Fraction(value) if isinstance(value, int) else value
        if isinstance(number, float) and not math.isfinite(number) or abs(number) > MAX_LITERAL:
            raise CalculatorError(f"the number {segment[:40]} is too large (at most 10**100)")
        return number

    def call(self, node: ast.Call) -> Number:
        if not isinstance(node.func, ast.Name) or node.func.id not in _CALLS:
            name = node.func.id if isinstance(node.func, ast.Name) else None
            shown = f"{name}()" if name else "this call"
            raise CalculatorError(f"{shown} not allowed: the only functions are "
                                  f"{', '.join(FUNCTIONS)}")
        if node.keywords:
            raise CalculatorError(f"{node.func.id}() takes no keyword arguments")
        function, least, most = _CALLS[node.func.id]
        if not least <= len(node.args) <= most:
            raise CalculatorError(f"{node.func.id}() takes {least}"
                                  + (f" to {most}" if most != least else "")
                                  + f" argument(s), got {len(node.args)}")
        args = [self.eval(arg) for arg in node.args]
        try:
            return _check(function(*args))
        except (OverflowError, ValueError) as exc:
            if isinstance(exc, CalculatorError):
                raise
            raise CalculatorError(f"{node.func.id}() failed: {exc}") from None


def format_number(value: Number) -> str:
    """GSM8K style: `42`, `2.5`, `3.333333`; tiny and huge floats in scientific notation."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e16:
            return str(int(value))
        if abs(value) >= 1e16:
            return repr(value)
        if abs(value) < 10**-DECIMALS:
            return f"{value:.6g}"
        value = Fraction(value)
    if value.denominator == 1:
        return str(value.numerator)
    if abs(value) < Fraction(1, 10**DECIMALS):
        return f"{float(value):.6g}"
    scaled = round(value * 10**DECIMALS)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**DECIMALS)
    text = f"{whole}.{frac:0{DECIMALS}d}".rstrip("0").rstrip(".")
    return "0" if text == "0" else sign + text


def evaluate(expr: str) -> str:
    """Evaluate one arithmetic expression and return the formatted result.

    Raises :class:`CalculatorError` with a message for the model when the expression is
    malformed, not allowed, or out of bounds.
    """
    if not isinstance(expr, str) or not expr.strip():
        raise CalculatorError("empty expression: write one, e.g. calculator[12 * (3 + 4)]")
    if len(expr) > MAX_LENGTH:
        raise CalculatorError(f"the expression is {len(expr)} characters long "
                              f"(at most {MAX_LENGTH}); split it into steps")
    source = _normalize(expr)
    if len(source) > MAX_LENGTH * 2:
        raise CalculatorError("the expression is too long; split it into steps")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {expr.strip()!r}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"cannot parse {expr.strip()!r}") from None
    try:
        value = _Evaluator(source).eval(tree)
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply") from None
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("the result is too large (overflow)") from None
    except TypeError as exc:
        raise CalculatorError(f"cannot evaluate {expr.strip()!r}: {exc}") from None
    return format_number(value)


class Calculator(Tool):
    """`calculator[expression]`: evaluate arithmetic safely (see the module docstring)."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression, e.g. calculator[(1,200 - 15% * 80) / 4]. "
        "Supports + - * / // % ** ^ x, parentheses, abs, round, min, max, sqrt, floor, ceil."
    )

    async def run(self, argument: str) -> Observation:
        try:
            result = evaluate(argument)
        except CalculatorError as exc:
            return Observation(f"Error: {exc}", ok=False, info={"expression": argument})
        return Observation(result, info={"expression": argument})
