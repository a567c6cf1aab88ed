"""Safe parsing and comparison of final answers, by value.

The verifier grades only the argument of ``finish(answer)``. That argument must be *one* mathematical expression
(``42``, ``-3/4``, ``0.75``, ``3*pi``, ``sqrt(2)/2``, ``\\frac{\\sqrt{2}}{2}``, ``x = 5``); anything else (prose, two
answers, a list of candidates) is refused with a reason, so a model cannot win by saying many things at once.

Untrusted text is never handed to ``eval`` (which ``sympy.sympify`` and ``parse_expr`` use underneath). This module
tokenizes the text itself and builds the value with a small recursive-descent parser over a closed grammar::

    answer := [NAME '='] sum
    sum    := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary | <implicit product> power)*      # 3pi, 2sqrt(3), 2(1+x)
    unary  := ('+' | '-') unary | power
    power  := atom [('^' | '**') unary]                               # right-associative: 2^3^2 = 2^9
    atom   := NUMBER | pi | e | sqrt atom | '(' sum ')' | '{' sum '}' | \\frac{sum}{sum} | \\sqrt[n]{sum}

Values are exact sympy numbers (``0.75`` becomes ``Rational(3, 4)``). What could blow up is bounded: the text length,
the nesting depth, literal sizes, and powers (a rational exponent of bounded size and a bounded result), so
``9^9^9^9`` is refused in microseconds instead of hanging the grader.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import sympy

MAX_CHARS = 200  # a final answer longer than this is not one answer
MAX_DEPTH = 40  # parentheses / operator nesting
MAX_EXPONENT = 1000  # |numerator| and |denominator| of a rational exponent
MAX_DIGITS = 2000  # estimated decimal digits of any power's result
PRECISION = 1000  # significant digits when comparing irrational values (see same_value)


class AnswerError(ValueError):
    """The text is not one well-formed answer; the message says why (it goes into the score details)."""


@dataclass(frozen=True)
class Parsed:
    """A parsed answer: its exact ``value`` and whether it contained a decimal literal (``exact=False``)."""

    value: sympy.Expr
    exact: bool
    text: str


# ---- normalization --------------------------------------------------------------------------------------------
_WRAPPERS = [(r"^\$\$(.*)\$\$$", 1), (r"^\$(.*)\$$", 1), (r"^\\\((.*)\\\)$", 1), (r"^\\\[(.*)\\\]$", 1)]
_UNICODE = {"\u2212": "-", "\u00d7": "*", "\u22c5": "*", "\u00b7": "*", "\u00f7": "/", "\u03c0": "pi", "\u221a": " sqrt "}
_LATEX_NOISE = re.compile(r"\\left|\\right|\\[,;!: ]|\\displaystyle")


def normalize(text: str) -> str:
    """Strip harmless wrappers: whitespace, ``$..$``, ``\\(..\\)``, one whole-answer ``\\boxed{..}``, a final period."""
    if not isinstance(text, str):
        raise AnswerError(f"the answer must be a string, got {type(text).__name__}")
    s = text.strip()
    if len(s) > 4 * MAX_CHARS:  # refuse before doing any regex work on a huge string
        raise AnswerError(f"the answer is {len(s)} characters long; give one short expression")
    for pattern, group in _WRAPPERS:
        m = re.match(pattern, s, re.S)
        if m:
            s = m.group(group).strip()
            break
    m = re.fullmatch(r"\\boxed\s*\{(.*)\}", s, re.S)
    if m and _balanced(m.group(1)):
        s = m.group(1).strip()
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = _LATEX_NOISE.sub(" ", s).strip()
    if s.endswith(".") and not re.search(r"\d\.$", s):  # "3/4." -> "3/4"; "42." stays a number
        s = s[:-1].rstrip()
    if not s:
        raise AnswerError("the answer is empty")
    if "\n" in s or "\r" in s:  # lines would join into one implicit product: sqrt(3)/3 <newline> sqrt(3)/2 ...
        raise AnswerError("the answer spans several lines; give one expression on one line")
    if len(s) > MAX_CHARS:
        raise AnswerError(f"the answer is {len(s)} characters long; give one short expression (<= {MAX_CHARS})")
    return s


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
    return depth == 0


# ---- tokens ---------------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"""
    (?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|\d+\.?\d*|\.\d+)   # 1,234,567 (strict grouping) | 12 | 1.5 | .5
  | (?P<cmd>\\[A-Za-z]+)
  | (?P<name>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<op>\*\*|[-+*/^(){}\[\]=])
  | (?P<space>\s+)
""", re.X)
_CONSTANTS = {"pi": sympy.pi, "\\pi": sympy.pi, "e": sympy.E, "E": sympy.E}
_MULT = {"*", "\\cdot", "\\times"}
_DIV = {"/", "\\div"}


def tokenize(s: str) -> list[str]:
    out, i = [], 0
    while i < len(s):
        m = _TOKEN.match(s, i)
        if not m:
            raise AnswerError(f"unexpected character {s[i]!r} at position {i}: give one expression, no prose")
        i = m.end()
        if m.lastgroup != "space":
            out.append(m.group())
    return out


class _Parser:
    def __init__(self, tokens: list[str]):
        self.toks, self.i, self.depth, self.exact = tokens, 0, 0, True

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None:
            raise AnswerError("the expression ends too early" + (f" (expected {want!r})" if want else ""))
        if want is not None and tok != want:
            raise AnswerError(f"expected {want!r}, found {tok!r}")
        self.i += 1
        return tok

    def nest(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise AnswerError("the expression is nested too deeply")

    # grammar ---------------------------------------------------------------------------------------------------
    def answer(self) -> sympy.Expr:
        if len(self.toks) >= 2 and self.toks[1] == "=" and _is_var(self.toks[0]):
            self.i = 2  # "x = 5": a single named value is one answer
        value = self.sum()
        if self.peek() is not None:
            raise AnswerError(f"unexpected {self.peek()!r} after a complete expression: give exactly one answer")
        return value

    def sum(self) -> sympy.Expr:
        self.nest()
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        self.depth -= 1
        return value

    def term(self) -> sympy.Expr:
        value = self.unary()
        while True:
            tok = self.peek()
            if tok in _MULT or tok in _DIV:
                self.take()
                rhs = self.unary()
                if tok in _DIV:
                    if rhs == 0:
                        raise AnswerError("division by zero")
                    value = value / rhs
                else:
                    value = value * rhs
            elif tok is not None and _starts_implicit_factor(tok):
                value = value * self.power()
            else:
                return value

    def unary(self) -> sympy.Expr:
        if self.peek() in ("+", "-"):
            self.nest()
            sign = self.take()
            value = self.unary()
            self.depth -= 1
            return -value if sign == "-" else value
        return self.power()

    def power(self) -> sympy.Expr:
        base = self.atom()
        if self.peek() in ("^", "**"):
            self.take()
            self.nest()
            exp = self.unary()
            self.depth -= 1
            return _safe_pow(base, exp)
        return base

    def atom(self) -> sympy.Expr:
        tok = self.take()
        if tok[0].isdigit() or tok[0] == ".":
            return self.number(tok)
        if tok in _CONSTANTS:
            return _CONSTANTS[tok]
        if tok in ("(", "{"):
            self.nest()
            value = self.sum()
            self.take(")" if tok == "(" else "}")
            self.depth -= 1
            return value
        if tok in ("sqrt", "\\sqrt"):
            if self.peek() == "[":  # \sqrt[n]{x}
                self.take("[")
                n = self.sum()
                self.take("]")
                if not (n.is_Integer and 2 <= n <= 64):
                    raise AnswerError("the root index must be an integer from 2 to 64")
                return _safe_pow(self.atom(), 1 / n)
            radicand = self.atom()
            if radicand.is_negative:
                raise AnswerError("square root of a negative number")
            return _safe_pow(radicand, sympy.Rational(1, 2))
        if tok in ("\\frac", "\\dfrac", "\\tfrac"):
            num, den = self.atom(), self.atom()
            if den == 0:
                raise AnswerError("division by zero")
            return num / den
        if tok[0] == "\\":
            raise AnswerError(f"unsupported LaTeX command {tok}")
        if tok[0].isalpha() or tok[0] == "_":
            raise AnswerError(f"unknown name {tok!r}: give a number or an expression in pi, e and sqrt, no prose")
        raise AnswerError(f"unexpected {tok!r}")

    def number(self, tok: str) -> sympy.Expr:
        digits = tok.replace(",", "")
        if len(digits) > 100:
            raise AnswerError("a number in the answer has more than 100 digits")
        if "." in digits:
            self.exact = False
            return sympy.Rational(digits.rstrip(".") or "0")
        return sympy.Integer(digits)


def _is_var(tok: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z_0-9]{0,11}", tok)) and tok not in _CONSTANTS and tok != "sqrt"


def _starts_implicit_factor(tok: str) -> bool:
    """``3pi``, ``2sqrt(2)``, ``2(1+3)``: an implicit product, but never ``3 5`` (two numbers are two answers)."""
    return tok in ("(", "{", "sqrt", "\\sqrt", "\\frac", "\\dfrac", "\\tfrac") or tok in _CONSTANTS


def _safe_pow(base: sympy.Expr, exp: sympy.Expr) -> sympy.Expr:
    """``base ** exp`` only when the result stays small: a rational exponent and a bounded number of digits."""
    if not exp.is_Rational:
        raise AnswerError("exponents must be rational numbers")
    if abs(exp.p) > MAX_EXPONENT or exp.q > MAX_EXPONENT:
        raise AnswerError(f"exponent {exp} is too large")
    if base == 0 and exp < 0:
        raise AnswerError("division by zero")
    if base.is_Rational and base != 0:
        size = max(abs(base.p), base.q)
        if size > 1 and abs(float(exp)) * math.log10(size) > MAX_DIGITS:
            raise AnswerError("the power is too large to be a final answer")
    elif not base.is_Rational and abs(exp) > 64:
        raise AnswerError("the power is too large to be a final answer")
    return sympy.Pow(base, exp)


def parse_answer(text: str) -> Parsed:
    """Parse one final answer; raises :class:`AnswerError` with the reason when it is not one expression."""
    s = normalize(text)
    parser = _Parser(tokenize(s))
    if not parser.toks:
        raise AnswerError("the answer is empty")
    value = parser.answer()
    if value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo) or value.is_real is False:
        raise AnswerError("the answer is not a finite real number")
    return Parsed(value=value, exact=parser.exact, text=s)


def same_value(given: Parsed, gold: Parsed) -> tuple[bool, str]:
    """Compare by value. A rational gold accepts any equal rational (``3/4``, ``0.75``, ``6/8``): exact comparison.

    An irrational gold (``sqrt(2)/2``, ``9*pi``) needs an irrational expression: a rational number (a fraction, a
    decimal) is an approximation and is refused. The two values are then compared to ``PRECISION`` significant digits rather than
    with ``simplify`` (which can run for minutes on a hostile ``(1+sqrt(2)+pi)^64``). Why that cannot be gamed: to
    land within ``10**-(PRECISION - 100)`` of the gold *without* writing it, an answer would have to carry about
    ``PRECISION`` digits of it, and a ``MAX_CHARS``-character answer cannot; an answer that already contains the exact
    gold (``gold + 10^-999``) is not a way to be rewarded without solving the problem.
    """
    a, b = given.value, gold.value
    if b.is_Rational:
        if a.is_Rational:
            return (a == b), ("equal" if a == b else f"{a} != {b}")
        return False, f"{a} is not the rational number {b}"
    if a.is_Rational:
        return False, "the exact answer is irrational: give an exact expression (e.g. sqrt(2)/2, 3*pi), not an approximation"
    x, y = sympy.N(a, PRECISION), sympy.N(b, PRECISION)
    ok = bool(abs(x - y) <= sympy.Float(10, PRECISION) ** (100 - PRECISION) * max(abs(y), 1))
    hint = "" if ok or given.exact else " (decimals are approximations: give an exact expression)"
    return ok, "equal" if ok else f"{a} != {b}{hint}"


def check(given_text: str, gold_text: str) -> tuple[bool, dict]:
    """``(passed, details)``: whether ``given_text`` is one answer equal in value to ``gold_text``."""
    gold = parse_answer(gold_text)  # trusted: comes from the task row
    try:
        given = parse_answer(given_text)
    except AnswerError as e:
        return False, {"reason": str(e), "expected": gold_text}
    ok, why = same_value(given, gold)
    return ok, {"reason": why, "parsed": str(given.value), "expected": gold_text}
