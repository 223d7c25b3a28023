"""CESQL's built-in functions (spec section 3.5) and how a call is dispatched.

A function is found by its upper-cased name and its number of arguments
(names are case-insensitive, as keywords are). Each argument is cast to its
parameter's type before the call; a function that fails raises ``EvalError``
with the value it returns (``origin`` is filled in by the call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dispatcher.cesql.values import (
    INT_MAX,
    INT_MIN,
    ZERO,
    EvalError,
    Type,
    Value,
    to_bool_explicit,
    to_int,
    to_str,
)


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    params: tuple[Type, ...]  # the fixed parameters
    variadic: Type | None  # the type of any further arguments
    returns: Type
    run: Callable[..., Value]

    def takes(self, count: int) -> bool:
        if self.variadic is None:
            return count == len(self.params)
        return count >= len(self.params)

    def param(self, index: int) -> Type:
        return self.params[index] if index < len(self.params) else self.variadic  # type: ignore[return-value]


def _fails(kind: Any, value: Value) -> EvalError:
    return EvalError(kind, value, None)


def _abs(x: int) -> int:
    if x == INT_MIN:
        raise _fails("math", INT_MAX)
    return abs(x)


def _left(x: str, count: int) -> str:
    if count < 0:
        raise _fails("functionEvaluation", x)
    return x[:count]


def _right(x: str, count: int) -> str:
    if count < 0:
        raise _fails("functionEvaluation", x)
    return x[len(x) - count :] if count < len(x) else x


def _substring(x: str, pos: int, length: int | None = None) -> str:
    if pos > len(x) or pos < -len(x):
        raise _fails("functionEvaluation", "")
    if length is not None and length < 0:
        raise _fails("functionEvaluation", "")
    if pos == 0:
        return ""
    start = pos - 1 if pos > 0 else len(x) + pos
    return x[start:] if length is None else x[start : start + length]


def _explicit(cast: Callable[[Value], Value], returns: Type) -> Callable[[Value], Value]:
    def run(value: Value) -> Value:
        try:
            return cast(value)
        except Exception:  # CastFailed: a cast function's own failure is a cast error
            raise _fails("cast", ZERO[returns]) from None

    return run


_BUILT_IN: Final = (
    Function("LENGTH", ("String",), None, "Integer", len),
    Function("CONCAT", (), "String", "String", lambda *xs: "".join(xs)),
    Function("CONCAT_WS", ("String",), "String", "String", lambda sep, *xs: sep.join(xs)),
    Function("LOWER", ("String",), None, "String", str.lower),
    Function("UPPER", ("String",), None, "String", str.upper),
    Function("TRIM", ("String",), None, "String", str.strip),
    Function("LEFT", ("String", "Integer"), None, "String", _left),
    Function("RIGHT", ("String", "Integer"), None, "String", _right),
    Function("SUBSTRING", ("String", "Integer"), None, "String", _substring),
    Function("SUBSTRING", ("String", "Integer", "Integer"), None, "String", _substring),
    Function("ABS", ("Integer",), None, "Integer", _abs),
    # The casting functions take any type: their parameter's cast is the call itself.
    Function("INT", ("String",), None, "Integer", _explicit(to_int, "Integer")),
    Function("BOOL", ("String",), None, "Boolean", _explicit(to_bool_explicit, "Boolean")),
    Function("STRING", ("String",), None, "String", to_str),
)

CASTING: Final = frozenset({"INT", "BOOL", "STRING"})


def find(name: str, count: int) -> Function | None:
    upper = name.upper()
    return next((f for f in _BUILT_IN if f.name == upper and f.takes(count)), None)


def arities(name: str) -> Sequence[str]:
    """How many arguments ``name`` takes, for the error that names a wrong count."""
    upper = name.upper()
    return [
        f"{len(f.params)}{' or more' if f.variadic else ''}" for f in _BUILT_IN if f.name == upper
    ]
