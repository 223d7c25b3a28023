"""CloudEvents SQL v1 (CESQL): the ``cesql`` filter dialect, parsed once, run per event.

``parse`` reads an expression with lark (the grammar in ``grammar.lark``) and
compiles it into closures (``compiler.py``); casts and errors are in
``values.py``, the built-in functions in ``functions.py``. A filter passes an
event when the expression returns ``true`` with no error (spec section 1.2).

An expression that is one attribute alone (``mybool``) is the one whose value's
type comes from the event, not from the expression: the specification's test
kit passes an event whose extension ``mybool`` is the JSON Boolean ``true``.
The service reads every attribute as the string that would be sent
(``Event.attributes``), whatever its content mode carried (a JSON Boolean in
structured mode, an AMQP boolean or the text ``true`` as a binary header), so
such a filter reads that value as a Boolean by the implicit cast (section
3.7: ``"true"`` or ``"false"`` in any case; anything else is a cast error and
does not pass). Every other expression's value is what it returns, and one
that is not a Boolean never passes (``STRING(TRUE)`` is the String
``'true'``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

from lark import (
    Lark,
    Token,
    Tree,
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)
from lark.exceptions import VisitError

from dispatcher.cesql.compiler import Attributes, Compiler, Node, _unsigned_min
from dispatcher.cesql.values import (
    ZERO,
    CastFailed,
    CesqlError,
    ErrorKind,
    EvalError,
    Value,
    to_bool,
)

__all__ = ["MAX_DEPTH", "CesqlError", "Expression", "parse"]


@dataclass(frozen=True, slots=True)
class Expression:
    text: str
    _root: Node
    # AND, OR and XOR mixed with no parentheses to group them: read left to right
    # here, as the specification says, but right to left by Knative's filter.
    ungrouped_logic: bool

    @property
    def attribute_alone(self) -> str | None:
        """The attribute's name when the expression is one attribute alone."""
        return self._root.attribute

    def passes(self, attributes: Attributes) -> bool:
        """The filter: true only for a Boolean true reached without an error (an
        attribute alone: its value read as a Boolean, see above)."""
        try:
            value = self._root.run(attributes)
            if self._root.attribute is not None and type(value) is str:
                return to_bool(value)
            return value is True
        except (EvalError, CastFailed):
            return False

    def evaluate(self, attributes: Attributes) -> tuple[Value, ErrorKind | None]:
        """The value and the first error, as the specification's test kit states them."""
        try:
            return self._root.run(attributes), None
        except EvalError as error:
            if error.origin is self._root.origin:
                return error.value, error.kind
            return ZERO[self._root.type or "Boolean"], error.kind


_GRAMMAR: Final = Path(__file__).with_name("grammar.lark")


@cache
def _parser() -> Lark:
    return Lark(_GRAMMAR.read_text(), parser="lalr", maybe_placeholders=True)


def parse(text: str) -> Expression:
    """Compile ``text``; ``CesqlError`` names the column of what is wrong."""
    try:
        tree = _parser().parse(text)
    except RecursionError:  # lark builds the tree of nested parentheses recursively
        raise CesqlError("parse", 1, f"nests deeper than {MAX_DEPTH} parentheses") from None
    except UnexpectedInput as error:
        column = len(text.rstrip()) + 1 if _at_end(error) else error.column
        raise CesqlError("parse", column, _explain(error, text)) from None
    _check_depth(tree)
    try:
        root = Compiler().transform(tree)
    except VisitError as error:  # lark wraps what a transformer raises
        if isinstance(error.orig_exc, CesqlError):
            raise error.orig_exc from None
        raise
    if _unsigned_min(root):
        raise CesqlError("parse", root.column, "2147483648 is not a 32-bit integer")
    return Expression(text, root, _ungrouped_logic(tree))


# Operations nested deeper than this are refused. The compiler and every
# evaluation recurse once or twice per level, and an expression a person
# writes nests a few levels, not hundreds: a limit turns what would be a
# RecursionError (at start, or on the loop thread per event) into a clear
# configuration error.
MAX_DEPTH: Final = 100


def _check_depth(tree: Tree[Token]) -> None:
    """Refuse ``tree`` if it nests deeper than ``MAX_DEPTH``; iterative, so that the
    check itself cannot run out of stack."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise CesqlError(
                "parse",
                _first_column(node),
                f"nests deeper than {MAX_DEPTH} operations or parentheses; "
                "a long chain of AND or OR counts one level per operator",
            )
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


def _first_column(node: Tree[Token]) -> int:
    """Where ``node``'s text starts (down its first children, without recursion)."""
    item: Tree[Token] | Token = node
    while isinstance(item, Tree) and item.children:
        item = item.children[0]
    return (item.column or 1) if isinstance(item, Token) else 1


def _ungrouped_logic(tree: Tree[Token]) -> bool:
    """A chain of AND/OR/XOR with two different words and no parentheses."""
    for node in tree.iter_subtrees():
        left = node.children[0] if node.data == "logic" else None
        if (
            isinstance(left, Tree)
            and left.data == "logic"
            and str(left.children[1]).upper() != str(node.children[1]).upper()
        ):
            return True
    return False


def _at_end(error: UnexpectedInput) -> bool:
    return isinstance(error, UnexpectedEOF) or (
        isinstance(error, UnexpectedToken) and error.token.type == "$END"
    )


def _explain(error: UnexpectedInput, text: str) -> str:
    if _at_end(error):
        return "the expression ends too soon"
    if isinstance(error, UnexpectedCharacters):
        return f"unexpected character {text[error.pos_in_stream or 0]!r}"
    if isinstance(error, UnexpectedToken):
        return f"unexpected {str(error.token)!r}"
    return str(error).splitlines()[0]
