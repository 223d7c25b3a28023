"""CESQL where the specification's test kit is silent: events as the service holds
them (every attribute a string), precedence, 32-bit arithmetic, the errors a
configuration gets, and that nothing but ``CesqlError`` ever leaves ``parse``
and nothing at all leaves a filter (the kit is run by tests/conformance)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dispatcher.cesql import MAX_DEPTH, CesqlError, parse

# What ``Event.attributes`` holds: every attribute a string, as it would be sent.
EVENT = {
    "specversion": "1.0",
    "id": "e-17",
    "source": "/orders/eu",
    "type": "com.example.order.created",
    "subject": "caf\u00e9",
    "sequence": "10",
    "hop": "3",
    "ttl": "12",
    "priority": "high",
    "flag": "TRUE",
}


def passes(expression: str, attributes: dict[str, Any] = EVENT) -> bool:
    return parse(expression).passes(attributes)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # The specification's examples, on string attributes: the literal's type decides.
        ("sequence = 10", True),
        ("sequence = '10'", True),
        ("sequence = 11", False),
        ("hop < ttl", True),  # '3' < '12' as integers, not as strings
        ("int(hop) < int(ttl) and int(hop) < 1000", True),
        ("INT(hop) < INT(ttl) AND INT(hop) < 1000", True),
        ("flag = TRUE", True),  # 'TRUE' cast to Boolean
        ("flag AND EXISTS id", True),
        ("type LIKE 'com.example.%'", True),
        ("type LIKE '%.created'", True),
        ("type LIKE '%example%'", True),
        ("type LIKE 'com.example'", False),
        ("subject LIKE 'caf_'", True),  # one character, not one byte
        ("source IN ('/orders/eu', '/orders/us')", True),
        ("priority NOT IN ('low', 'medium')", True),
        ("LOWER(priority) = 'high' AND LENGTH(id) = 4", True),
        ("sequence + 1 = 11", True),
        ("sequence * 2 > 19 XOR hop = 3", False),
        # A missing attribute is an error: the filter fails, even under NOT.
        ("region = 'eu'", False),
        ("NOT (region = 'eu')", False),
        ("region != 'eu'", False),
        # ... unless the expression never reaches it.
        ("NOT EXISTS region OR region != 'eu'", True),
        ("EXISTS region AND region = 'eu'", False),
        # Only a Boolean true passes.
        ("sequence", False),
        ("'true'", False),
        ("1", False),
        # Errors make the filter fail wherever they are.
        ("sequence / 0 = 0", False),
        ("INT(source) = 0", False),
        ("NOT sequence", False),
        ("2147483647 + 1 > 0", False),  # outside 32 bits: a math error
        ("-(-2147483648) > 0", False),
        ("ABS(-2147483648) > 0", False),
    ],
)
def test_a_filter_passes_only_a_true_without_errors(expression: str, expected: bool) -> None:
    assert passes(expression) is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, True),  # a test kit's event: the JSON Boolean itself
        (False, False),
        ("true", True),  # the service's events: every attribute the text it was sent as
        ("TRUE", True),  # the implicit cast reads "true" and "false" in any case
        ("False", False),
        ("yes", False),  # a cast error
        ("1", False),
        ("", False),
        (1, False),  # an Integer is no Boolean: the kit makes ``NOT 10`` a cast error
    ],
)
def test_an_attribute_alone_is_read_as_a_boolean(value: Any, expected: bool) -> None:
    """Issue 41: a filter that is one attribute alone (the test kit's ``mybool``)
    passes when that attribute is a Boolean true, however the event carried it;
    parenthesised it is the same expression. An attribute that is absent fails."""
    attributes = {**EVENT, "mybool": value}
    assert passes("mybool", attributes) is expected
    assert passes("(mybool)", attributes) is expected
    assert passes("mybool", EVENT) is False


@pytest.mark.parametrize("expression", ["STRING(TRUE)", "UPPER(flag)", "'true'", "LOWER('TRUE')"])
def test_any_other_value_that_is_not_a_boolean_never_passes(expression: str) -> None:
    """Only an attribute's value takes its type from the event: what an expression
    computes is the type it computes, and a String is no filter's true (spec 1.2)."""
    assert passes(expression) is False


def test_and_or_xor_are_evaluated_left_to_right() -> None:
    """One precedence level, left to right (spec section 3.6). Knative's filter (the
    Go SDK, from the ANTLR grammar) groups them from the right: ``TRUE OR TRUE
    AND FALSE`` is false here and true there. Parentheses mean the same in both."""
    assert parse("TRUE OR TRUE AND FALSE").evaluate({}) == (False, None)
    assert parse("TRUE OR (TRUE AND FALSE)").evaluate({}) == (True, None)
    assert parse("FALSE AND FALSE OR TRUE").evaluate({}) == (True, None)


@pytest.mark.parametrize(
    ("expression", "value", "error"),
    [
        ("4 -1", 3, None),  # a minus between operands subtracts, spaced or not
        ("7 / -2", -3, None),  # truncated towards zero
        ("-7 % 2", -1, None),  # the sign of the dividend
        ("7 % -2", 1, None),
        ("2147483647 + 1", 0, "math"),
        ("-2147483647 - 2", 0, "math"),
        ("65536 * 65536", 0, "math"),
        ("-2147483648 / -1", 0, "math"),
        ("-2147483648", -2147483648, None),
        ("--2147483648", 0, "math"),
    ],
)
def test_integers_are_32_bit(expression: str, value: int, error: str | None) -> None:
    assert parse(expression).evaluate({}) == (value, error)


@pytest.mark.parametrize(
    ("expression", "column", "kind"),
    [
        ("type = ", 7, "parse"),
        ("type == 'a'", 7, "parse"),
        ("type = 'a", 8, "parse"),
        ("(type = 'a'", 12, "parse"),
        ("type LIKE subject", 11, "parse"),  # the pattern must be a literal
        ("type IN ()", 10, "parse"),  # an empty set
        ("2147483648 > 0", 1, "parse"),
        ("x = 1 AND my_attr = 2", 11, "parse"),
        ("ABS(1, 2)", 1, "missingFunction"),
        ("x = NOW()", 5, "missingFunction"),
        ("x = 1 AND ab_c(1)", 11, "missingFunction"),
        ("x = 1; DROP", 6, "parse"),
    ],
)
def test_an_expression_that_cannot_compile_names_the_column(
    expression: str, column: int, kind: str
) -> None:
    with pytest.raises(CesqlError) as refused:
        parse(expression)
    assert (refused.value.column, refused.value.kind) == (column, kind), refused.value


def test_keywords_and_function_names_ignore_case_attribute_names_are_lowered() -> None:
    assert passes("exists SOURCE and Type like 'com.%' and lower(PRIORITY) = 'high'")


def test_string_literals_escape_their_own_quote() -> None:
    assert parse("'it\\'s'").evaluate({}) == ("it's", None)
    assert parse("'it''s'").evaluate({}) == ("it's", None)
    assert parse('"say \\"hi\\""').evaluate({}) == ('say "hi"', None)
    assert parse("'a\\\\b'").evaluate({}) == ("a\\\\b", None)  # other backslashes stay


# Pieces of expressions, valid and not, for the fuzz below.
_PIECES = st.sampled_from(
    [
        "type",
        "sequence",
        "missing",
        "id",
        "1",
        "0",
        "-1",
        "2147483647",
        "'10'",
        "'true'",
        "'a%'",
        "TRUE",
        "false",
        "(",
        ")",
        ",",
        "=",
        "!=",
        "<>",
        "<",
        ">=",
        "+",
        "-",
        "*",
        "/",
        "%",
        "AND",
        "OR",
        "XOR",
        "NOT",
        "LIKE",
        "IN",
        "EXISTS",
        "INT",
        "BOOL",
        "STRING",
        "LENGTH",
        "ABS",
        "SUBSTRING",
        "LEFT",
        "CONCAT_WS",
        "UPPER",
        "'\\''",
        "@",
        '"x"',
    ]
)
_VALUES = st.one_of(st.text(max_size=6), st.integers(-(2**31), 2**31 - 1), st.booleans())


@settings(max_examples=3000, deadline=None)
@given(
    st.lists(_PIECES, max_size=14).map(" ".join),
    st.dictionaries(st.sampled_from(["type", "sequence", "id", "other"]), _VALUES),
)
def test_nothing_but_a_compile_error_leaves_parse_and_nothing_leaves_a_filter(
    text: str, attributes: dict[str, Any]
) -> None:
    try:
        expression = parse(text)
    except CesqlError as error:
        assert error.kind in ("parse", "missingFunction") and error.column >= 1
        return
    value, error = expression.evaluate(attributes)
    assert type(value) in (bool, int, str)
    # The filter's fast paths agree with the exact evaluation.
    assert expression.passes(attributes) is verdict(expression, value, error)
    for name, attribute in attributes.items():  # and with every value as a string
        attributes[name] = str(attribute).lower() if type(attribute) is bool else str(attribute)
    value, error = expression.evaluate(attributes)
    assert expression.passes(attributes) is verdict(expression, value, error)


def verdict(expression: Any, value: Any, error: str | None) -> bool:
    """What a filter decides from the exact evaluation: a Boolean true without an
    error, or, for an attribute alone, its value read as a Boolean (issue 41)."""
    if error is not None:
        return False
    if expression.attribute_alone is not None and type(value) is str:
        return value.lower() == "true"
    return value is True


@pytest.mark.parametrize(
    "nested",
    [
        lambda n: "(" * n + "true" + ")" * n,
        lambda n: "NOT " * n + "true",
        lambda n: " AND ".join(["true"] * (n + 1)),
        lambda n: "-" * n + "1",
        lambda n: "LOWER(" * n + "'a'" + ")" * n + " = 'a'",
    ],
)
def test_nesting_is_bounded_with_a_clear_error_not_a_recursion_error(nested) -> None:
    """The compiler and every evaluation recurse per level: past the bound an
    expression is a configuration error, never a RecursionError (at start, or
    on the loop thread for each event), however deep it goes."""
    assert parse(nested(90)).evaluate(EVENT)[1] is None
    for depth in (MAX_DEPTH + 1, 5_000, 100_000):
        with pytest.raises(CesqlError) as refused:
            parse(nested(depth))
        assert "nests deeper than 100" in refused.value.message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9" * 5_000, (False, "cast")),  # beyond 32 bits: a cast error, whatever its length
        ("-" + "9" * 5_000, (False, "cast")),
        ("0" * 5_000 + "7", (True, None)),  # leading zeros are no digits of the number
        ("+" + "0" * 5_000, (False, None)),
    ],
)
def test_an_integer_string_of_any_length_casts_or_fails_as_a_cast(
    value: str, expected: tuple[bool, str | None]
) -> None:
    """``int()`` refuses more than 4,300 digits with a ValueError: an event carrying
    such a number met it as a bug, on every redelivery, instead of a cast error."""
    assert parse("num > 5").evaluate({"num": value}) == expected
    assert parse("num > 5").passes({"num": value}) is expected[0]


def test_an_integer_literal_of_any_length_is_a_compile_error() -> None:
    with pytest.raises(CesqlError, match="is not a 32-bit integer"):
        parse("num > " + "9" * 5_000)
    assert parse("num = " + "0" * 5_000 + "7").passes({"num": "7"})


def _like_by_regex(pattern: str, value: str) -> bool:
    """LIKE as a regular expression: right, but it backtracks."""
    pieces = re.findall(r"\\[%_]|.", pattern, re.S)
    regex = "".join(".*" if p == "%" else "." if p == "_" else re.escape(p[-1]) for p in pieces)
    return re.fullmatch(regex, value, re.S) is not None


_LIKE_CHARS = st.sampled_from(["a", "b", "/", "%", "_", "\\", "\\%", "\\_", "\u00e9"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_LIKE_CHARS, max_size=8).map("".join), st.text("ab/%_\\\u00e9", max_size=10))
def test_like_matches_as_its_regular_expression_would(pattern: str, value: str) -> None:
    assume(not pattern.endswith("\\"))  # it would escape the literal's closing quote
    assert passes(f"subject LIKE '{pattern}'", {"subject": value}) is _like_by_regex(pattern, value)


@pytest.mark.timeout(20)
def test_like_takes_linear_time_where_a_regular_expression_backtracks() -> None:
    """``'%/%/%/%.json'`` against 1,000 slashes took Python's ``re`` 47 s, on the
    loop every binding and heartbeat shares; 100,000 here must not hang."""
    expression = parse("subject LIKE '%/%/%/%.json'")
    assert not expression.passes({"subject": "/" * 100_000})
    assert expression.passes({"subject": "/" * 100_000 + ".json"})
    assert parse("subject LIKE '%a_b%a_b%c'").passes({"subject": "axb" * 30_000 + "ayb" + "c"})
