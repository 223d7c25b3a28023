"""A CESQL expression's parse tree turned into one closure per operation.

Each node becomes a ``Node``: a function of the attribute mapping and the
type it returns (``None`` for an attribute: its value's own type, known only
per event). Operands whose type is known here are not cast per event; the
implicit casts the specification asks for (section 3.7) happen only where
the types differ.

Errors follow the specification's model as its test kit reads it: an
operation whose own cast, arithmetic or function fails raises ``EvalError``
with the value it returns; one whose operand failed returns its own zero
value, which ``Expression.evaluate`` reports for the operation at the top.

The operations a filter is made of (comparisons, ``LIKE``, ``AND``/``OR``,
``NOT``, calls) have two paths: a fast one that reads an attribute and casts
it inline (``_typed``) and, when a cast fails, the exact one, which evaluates
again and says which value and error the specification gives. A 5-predicate
filter costs 1-2 us per event (``tests/bench/filter_cost.py``).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from lark import Token, Transformer, v_args

from dispatcher.cesql import functions
from dispatcher.cesql.values import (
    CASTS,
    INT_MAX,
    INT_MIN,
    ZERO,
    CastFailed,
    CesqlError,
    EvalError,
    Type,
    Value,
    bounded_int,
    in_range,
    type_of,
)

Attributes = Mapping[str, Any]
Evaluate = Callable[[Attributes], Value]

_MISSING: Final = object()
_ATTRIBUTE_NAME: Final = re.compile(r"[a-z0-9]+")
_FUNCTION_NAME: Final = re.compile(r"[A-Z][A-Z_]*")


@dataclass(frozen=True, slots=True)
class Node:
    run: Evaluate
    type: Type | None  # None: an attribute, whose type is its value's
    origin: object  # identifies this operation in an EvalError
    constant: Value | None = None  # a literal's value
    column: int = 0  # where a literal starts
    attribute: str | None = None  # the name, for an attribute reference


# 2147483648 is a 32-bit integer only under a minus sign, which folds it.
_UNSIGNED_MIN: Final = INT_MAX + 1


def _unsigned_min(node: object) -> bool:
    return isinstance(node, Node) and node.type == "Integer" and node.constant == _UNSIGNED_MIN


_PYTHON: Final[dict[Type, type]] = {"Boolean": bool, "Integer": int, "String": str}


def _typed(node: Node, target: Type) -> Evaluate:
    """``node``'s value as ``target``, for an operation's fast path: a cast that
    fails raises ``CastFailed``, and the operation then evaluates again on its
    exact path, which gives the value and error the specification asks for.
    (An expression has no side effects, so evaluating it twice is safe.)

    An attribute is read here rather than through its own closure: an
    attribute compared with a literal is most of what a filter does."""
    if node.type == target:
        return node.run
    cast = CASTS[target]
    if node.constant is not None:
        try:
            value = cast(node.constant)
        except CastFailed:
            pass  # never castable: every evaluation takes the exact path
        else:
            return lambda _attributes: value
    wanted = _PYTHON[target]
    if node.attribute is not None:
        name, origin = node.attribute, node.origin

        def fetch(attributes: Attributes) -> Value:
            value = attributes.get(name, _MISSING)
            if type(value) is wanted:
                return value  # type: ignore[return-value]
            if value is _MISSING:
                raise EvalError("missingAttribute", False, origin)
            return cast(value)

        return fetch
    run = node.run

    def converted(attributes: Attributes) -> Value:
        value = run(attributes)
        return value if type(value) is wanted else cast(value)

    return converted


def _cast(node: Node, target: Type) -> Callable[[Value], Value] | None:
    """The cast ``node``'s value needs to become ``target``; None when it has that type."""
    return None if node.type == target else CASTS[target]


def _operands(
    left: Node, right: Node, ltype: Type, rtype: Type
) -> Callable[[Attributes], tuple[Value, Value, bool]]:
    """Both operands, cast to the operator's parameter types: (x, y, a cast failed).

    A failed cast gives the type's zero value, as the specification has it."""
    lrun, rrun = left.run, right.run
    lcast, rcast = _cast(left, ltype), _cast(right, rtype)
    lzero, rzero = ZERO[ltype], ZERO[rtype]

    def both(attributes: Attributes) -> tuple[Value, Value, bool]:
        x, y, failed = lrun(attributes), rrun(attributes), False
        if lcast is not None:
            try:
                x = lcast(x)
            except CastFailed:
                x, failed = lzero, True
        if rcast is not None:
            try:
                y = rcast(y)
            except CastFailed:
                y, failed = rzero, True
        return x, y, failed

    return both


def _on_integers(
    left: Node, right: Node, op: Callable[[int, int], Value], origin: object
) -> Evaluate:
    """An operator on two Integers, exactly: a failed cast of either is its own error."""
    both = _operands(left, right, "Integer", "Integer")

    def run(attributes: Attributes) -> Value:
        x, y, failed = both(attributes)
        result = op(x, y)  # type: ignore[arg-type]
        if failed:
            raise EvalError("cast", result, origin)
        return result

    return run


def _integer_op(symbol: str, origin: object) -> Callable[[int, int], int]:
    def checked(value: int) -> int:
        if not in_range(value):
            raise EvalError("math", 0, origin)
        return value

    def divide(x: int, y: int) -> int:
        if y == 0:
            raise EvalError("math", 0, origin)
        quotient = abs(x) // abs(y)  # rounded towards 0
        return checked(quotient if (x < 0) == (y < 0) else -quotient)

    def remainder(x: int, y: int) -> int:
        if y == 0:
            raise EvalError("math", 0, origin)
        rest = abs(x) % abs(y)  # the sign of x
        return rest if x >= 0 else -rest

    ops: dict[str, Callable[[int, int], int]] = {
        "+": lambda x, y: checked(x + y),
        "-": lambda x, y: checked(x - y),
        "*": lambda x, y: checked(x * y),
        "/": divide,
        "%": remainder,
    }
    return ops[symbol]


_ORDER: Final[dict[str, Callable[[int, int], bool]]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}


def _like_test(pattern: str) -> Callable[[str], bool]:
    """``%`` any run, ``_`` one character, ``\\%`` and ``\\_`` themselves; any other
    backslash is itself (the kit's ``'ab\\c' LIKE 'ab\\c'`` is true).

    The common shapes (no wildcard, one ``%`` at the end or at the start) are
    string methods; the rest ``_glob``, which takes time linear in the value per
    piece of the pattern. Not a regular expression: Python's backtracks, and
    ``'%/%/%/%.json'`` against a subject of 1,000 slashes held the loop (and
    every binding, and the heartbeats) for 47 s. Knative's RE2 does not backtrack."""
    pieces = re.findall(r"\\[%_]|.", pattern, re.S)
    wild = [index for index, piece in enumerate(pieces) if piece in ("%", "_")]
    plain = "".join(piece[-1] for piece in pieces if piece not in ("%", "_"))
    if not wild:
        return plain.__eq__
    if wild == [len(pieces) - 1] and pieces[-1] == "%":
        return lambda value: value.startswith(plain)
    if wild == [0] and pieces[0] == "%":
        return lambda value: value.endswith(plain)
    if wild == [0, len(pieces) - 1] and pieces[0] == pieces[-1] == "%" and len(pieces) > 1:
        return lambda value: plain in value
    segments: list[list[str | None]] = [[]]  # between the %s; None is a _
    for piece in pieces:
        if piece == "%":
            segments.append([])
        else:
            segments[-1].append(None if piece == "_" else piece[-1])
    parts = tuple(_Segment(segment) for segment in segments)
    return lambda value: _glob(parts, value)


@dataclass(frozen=True, slots=True)
class _Segment:
    """A run of a LIKE pattern between two ``%``: characters, ``None`` for ``_``."""

    chars: tuple[str | None, ...]
    literal: str | None  # the run as a string when it has no _

    def __init__(self, chars: list[str | None]) -> None:
        object.__setattr__(self, "chars", tuple(chars))
        literal = None if None in chars else "".join(c for c in chars if c is not None)
        object.__setattr__(self, "literal", literal)

    def at(self, value: str, index: int) -> bool:
        """Whether this run matches ``value`` from ``index`` on."""
        if index + len(self.chars) > len(value):
            return False
        return all(c is None or value[index + k] == c for k, c in enumerate(self.chars))

    def find(self, value: str, start: int, end: int) -> int:
        """Where it first matches wholly inside ``value[start:end]``, else -1."""
        if self.literal is not None:
            return value.find(self.literal, start, end)
        for index in range(start, end - len(self.chars) + 1):
            if self.at(value, index):
                return index
        return -1


def _glob(segments: tuple[_Segment, ...], value: str) -> bool:
    """The first run at the start, the last at the end, each run between them at
    its leftmost place after the one before: a ``%`` takes any run, so the
    leftmost place leaves the most room for what follows and is never wrong."""
    first, last = segments[0], segments[-1]
    if len(segments) == 1:
        return len(value) == len(first.chars) and first.at(value, 0)
    end = len(value) - len(last.chars)
    start = len(first.chars)
    if end < start or not first.at(value, 0) or not last.at(value, end):
        return False
    for segment in segments[1:-1]:
        found = segment.find(value, start, end)
        if found < 0:
            return False
        start = found + len(segment.chars)
    return True


def _unquote(text: str) -> str:
    quote, body = text[0], text[1:-1]
    escaped, doubled = "\\" + quote, quote * 2
    return re.sub(
        r"\\.|" + re.escape(doubled),
        lambda m: quote if m.group() in (escaped, doubled) else m.group(),
        body,
        flags=re.S,
    )


def _literal(value: Value, column: int = 0) -> Node:
    return Node(lambda _attributes: value, type_of(value), object(), value, column)


@v_args(inline=True)
class Compiler(Transformer[Token, Node]):
    """The lark tree, bottom up, into ``Node``s."""

    def _call_userfunc(self, tree: Any, new_children: Any = None) -> Any:
        if tree.data != "minus":
            for child in new_children or ():
                if _unsigned_min(child):
                    raise CesqlError("parse", child.column, "2147483648 is not a 32-bit integer")
        return super()._call_userfunc(tree, new_children)  # type: ignore[no-untyped-call]

    # ------------------------------------------------------------------ atoms
    def group(self, inner: Node) -> Node:
        return inner  # kept in the tree only for ``ungrouped_logic``

    def string(self, token: Token) -> Node:
        return _literal(_unquote(str(token)))

    def integer(self, *tokens: Token) -> Node:
        digits, column = tokens[-1], tokens[0].column or 0
        number = bounded_int(str(digits))
        signed = len(tokens) == 2
        if number is None or number > _UNSIGNED_MIN or (number == _UNSIGNED_MIN and signed):
            raise CesqlError("parse", column, f"{digits} is not a 32-bit integer")
        return _literal(number, column)

    def true(self, _token: Token) -> Node:
        return _literal(True)

    def false(self, _token: Token) -> Node:
        return _literal(False)

    def attribute(self, token: Token) -> Node:
        name = _attribute_name(token)
        origin = object()

        def run(attributes: Attributes) -> Value:
            value = attributes.get(name, _MISSING)
            if value is _MISSING:
                raise EvalError("missingAttribute", False, origin)
            return value  # type: ignore[no-any-return]

        return Node(run, None, origin, attribute=name)

    def exists(self, _keyword: Token, token: Token) -> Node:
        name = _attribute_name(token)
        return Node(lambda attributes: name in attributes, "Boolean", object())

    # -------------------------------------------------------------- operators
    def negate(self, _keyword: Token, operand: Node) -> Node:
        origin, run = object(), _typed(operand, "Boolean")
        if operand.type == "Boolean":
            return Node(lambda attributes: not run(attributes), "Boolean", origin)

        def negated(attributes: Attributes) -> bool:
            try:
                return not run(attributes)
            except CastFailed:
                raise EvalError("cast", True, origin) from None

        return Node(negated, "Boolean", origin)

    def minus(self, sign: Token, operand: Node) -> Node:
        if operand.type == "Integer" and operand.constant is not None:
            folded = -operand.constant  # type: ignore[operator]
            if in_range(folded):  # -(-2147483648) is left to fail as arithmetic does
                return _literal(folded, sign.column or 0)
        origin, run, cast = object(), operand.run, _cast(operand, "Integer")

        def negative(attributes: Attributes) -> int:
            value = run(attributes)
            if cast is not None:
                try:
                    value = cast(value)
                except CastFailed:
                    raise EvalError("cast", 0, origin) from None
            if value == INT_MIN:
                raise EvalError("math", 0, origin)
            return -value  # type: ignore[operator]

        return Node(negative, "Integer", origin)

    def arithmetic(self, left: Node, symbol: Token, right: Node) -> Node:
        origin = object()
        op = _integer_op(str(symbol), origin)
        return Node(_on_integers(left, right, op, origin), "Integer", origin)

    def compare(self, left: Node, symbol: Token, right: Node) -> Node:
        origin, text = object(), str(symbol)
        if text in _ORDER:
            order = _ORDER[text]
            exact = _on_integers(left, right, order, origin)
            lx, ry = _typed(left, "Integer"), _typed(right, "Integer")

            def ordered(attributes: Attributes) -> Value:
                try:
                    return order(lx(attributes), ry(attributes))  # type: ignore[arg-type]
                except CastFailed:
                    return exact(attributes)

            return Node(ordered, "Boolean", origin)
        return Node(_equality(left, right, text == "=", origin), "Boolean", origin)

    def logic(self, left: Node, symbol: Token, right: Node) -> Node:
        origin, word = object(), str(symbol).upper()
        lrun, rrun = left.run, right.run
        if word == "XOR":
            both = _operands(left, right, "Boolean", "Boolean")

            def either(attributes: Attributes) -> bool:
                x, y, failed = both(attributes)
                if failed:
                    raise EvalError("cast", x != y, origin)
                return x != y

            return Node(either, "Boolean", origin)
        decisive = word == "OR"  # the left value that makes the right one unneeded
        if left.type == right.type == "Boolean":
            if decisive:
                return Node(lambda a: lrun(a) or rrun(a), "Boolean", origin)
            return Node(lambda a: lrun(a) and rrun(a), "Boolean", origin)
        lcast, rcast = _cast(left, "Boolean"), _cast(right, "Boolean")
        bx, by = _typed(left, "Boolean"), _typed(right, "Boolean")

        def short_circuit(attributes: Attributes) -> bool:
            try:
                if decisive:
                    return bx(attributes) or by(attributes)  # type: ignore[return-value]
                return bx(attributes) and by(attributes)  # type: ignore[return-value]
            except CastFailed:
                return exact(attributes)

        def exact(attributes: Attributes) -> bool:
            failed, x = False, lrun(attributes)
            if lcast is not None:
                try:
                    x = lcast(x)
                except CastFailed:
                    x, failed = False, True
            if x is decisive:
                result = decisive
            else:
                y = rrun(attributes)
                if rcast is not None:
                    try:
                        y = rcast(y)
                    except CastFailed:
                        y, failed = False, True
                result = y  # type: ignore[assignment]
            if failed:
                raise EvalError("cast", result, origin)
            return result

        return Node(short_circuit, "Boolean", origin)

    def like(self, subject: Node, *rest: Token) -> Node:
        negated = len(rest) == 3
        test = _like_test(_unquote(str(rest[-1])))
        run = _typed(subject, "String")  # a cast to String never fails
        if negated:
            return Node(lambda a: not test(run(a)), "Boolean", object())  # type: ignore[arg-type]
        return Node(lambda a: test(run(a)), "Boolean", object())  # type: ignore[arg-type]

    def in_set(self, subject: Node, *rest: Any) -> Node:
        negated = isinstance(rest[0], Token) and rest[0].type == "NOT"
        elements = [item for item in rest if isinstance(item, Node)]
        return Node(_membership(subject, elements, negated, origin := object()), "Boolean", origin)

    def call(self, name: Token, *arguments: Node | None) -> Node:
        given = [argument for argument in arguments if argument is not None]
        if not _FUNCTION_NAME.fullmatch(str(name).upper()):
            raise CesqlError("parse", name.column or 0, f"{name} is not a function name")
        function = functions.find(str(name), len(given))
        if function is None:
            known = functions.arities(str(name))
            detail = f"takes {' or '.join(known)} arguments" if known else "is not a function"
            raise CesqlError(
                "missingFunction",
                name.column or 0,
                f"{str(name).upper()} with {len(given)} arguments: {str(name).upper()} {detail}",
            )
        return _call(function, given)


def _attribute_name(token: Token) -> str:
    name = str(token).lower()  # the kit writes ``EXISTS SOURCE``
    if not _ATTRIBUTE_NAME.fullmatch(name):
        raise CesqlError(
            "parse",
            token.column or 0,
            f"{token} is not an attribute name (lower-case letters and digits)",
        )
    return name


def _equality(left: Node, right: Node, equal: bool, origin: object) -> Evaluate:
    """``=`` (``equal``) or ``!=``/``<>``: the left value is cast to the right one's type."""
    lrun, rrun = left.run, right.run
    if right.type is not None:
        cast = _cast(left, right.type)
        target: Type | None = right.type
    else:
        cast, target = None, None

    def exact(attributes: Attributes) -> bool:
        x, y = lrun(attributes), rrun(attributes)
        to = cast if target is not None else (None if type(x) is type(y) else CASTS[type_of(y)])
        if to is not None:
            try:
                x = to(x)
            except CastFailed:
                # The left value has no value of the right one's type: its zero stands in.
                raise EvalError("cast", (ZERO[type_of(y)] == y) is equal, origin) from None
        return (x == y) is equal

    if right.type is None:
        return exact  # the right value's type decides the cast, per event
    lx = _typed(left, right.type)
    if right.constant is not None:
        constant = right.constant

        def with_constant(attributes: Attributes) -> bool:
            try:
                return (lx(attributes) == constant) is equal
            except CastFailed:
                return exact(attributes)

        return with_constant

    def typed(attributes: Attributes) -> bool:
        try:
            return (lx(attributes) == rrun(attributes)) is equal
        except CastFailed:
            return exact(attributes)

    return typed


def _membership(subject: Node, elements: list[Node], negated: bool, origin: object) -> Evaluate:
    """``IN``: each element cast to the subject's type, compared as ``=`` does."""
    run = subject.run
    literals = [element.constant for element in elements if element.constant is not None]
    if len(literals) == len(elements):
        by_type: dict[type, frozenset[Value] | None] = {}
        for name, cast in CASTS.items():
            try:
                values = frozenset(cast(value) for value in literals)
            except CastFailed:
                values = None  # some element has no value of this type: a cast error
            by_type[{"Boolean": bool, "Integer": int, "String": str}[name]] = values

        def among_literals(attributes: Attributes) -> bool:
            value = run(attributes)
            values = by_type[type(value)]
            if values is None:
                found = any(_cast_or_none(element, type_of(value)) == value for element in literals)
                raise EvalError("cast", found is not negated, origin)
            return (value in values) is not negated

        return among_literals
    runs = [element.run for element in elements]

    def among(attributes: Attributes) -> bool:
        value = run(attributes)
        target, failed, found = type_of(value), False, False
        for element in runs:
            item = element(attributes)
            cast = _cast_or_none(item, target)
            if cast is None:
                failed = True
            elif cast == value:
                found = True
                break
        if failed:
            raise EvalError("cast", found is not negated, origin)
        return found is not negated

    return among


def _cast_or_none(value: Value, target: Type) -> Value | None:
    if type_of(value) == target:
        return value
    try:
        return CASTS[target](value)
    except CastFailed:
        return None


def _call(function: functions.Function, arguments: list[Node]) -> Node:
    origin = object()
    explicit = function.name in functions.CASTING
    runs = [argument.run for argument in arguments]
    casts = [
        None if explicit else _cast(argument, function.param(index))
        for index, argument in enumerate(arguments)
    ]
    call = function.run
    typed = [
        argument.run if explicit else _typed(argument, function.param(index))
        for index, argument in enumerate(arguments)
    ]

    def fast(attributes: Attributes) -> Value:
        try:
            return call(*[argument(attributes) for argument in typed])
        except CastFailed:
            return exact(attributes)
        except EvalError as error:
            if error.origin is None:  # the function's own
                error.origin = origin
            raise

    if len(typed) == 1:
        [only] = typed

        def fast(attributes: Attributes) -> Value:
            try:
                return call(only(attributes))
            except CastFailed:
                return exact(attributes)
            except EvalError as error:
                if error.origin is None:
                    error.origin = origin
                raise

    def exact(attributes: Attributes) -> Value:
        values, failed = [], False
        for index, (evaluate, cast) in enumerate(zip(runs, casts, strict=True)):
            value = evaluate(attributes)
            if cast is not None:
                try:
                    value = cast(value)
                except CastFailed:
                    value, failed = ZERO[function.param(index)], True
            values.append(value)
        try:
            result = call(*values)
        except EvalError as error:
            error.origin = origin
            raise
        if failed:
            raise EvalError("cast", result, origin)
        return result

    return Node(fast, function.returns, origin)
