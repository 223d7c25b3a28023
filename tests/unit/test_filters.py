"""Trigger filters: the compiled predicates against a plain reference evaluator.

The reference reads the configuration as written (the YAML's dicts and lists)
and says what Knative's filter would: it shares no code with
``dispatcher.delivery.filters`` or with the settings tree it is compiled from.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import settings_from_dict
from dispatcher.delivery.filters import compile_filter
from tests.support.fuzz import fuzz_settings

# ------------------------------------------------------------------ reference


def reference(binding: dict[str, Any], attributes: dict[str, str]) -> bool:
    """Knative's broker filter: ``filters`` when set, else ``filter.attributes``."""
    if binding.get("filters"):
        return all(reference_entry(entry, attributes) for entry in binding["filters"])
    for name, value in ((binding.get("filter") or {}).get("attributes") or {}).items():
        if value == "":
            if name not in attributes:  # present is enough, an empty value too
                return False
        elif attributes.get(name) != value:
            return False
    return True


def reference_entry(entry: dict[str, Any], attributes: dict[str, str]) -> bool:
    [(dialect, body)] = entry.items()
    if dialect == "all":
        return all(reference_entry(inner, attributes) for inner in body)
    if dialect == "any":
        return any(reference_entry(inner, attributes) for inner in body)
    if dialect == "not":
        return not reference_entry(body, attributes)
    compare = {
        "exact": lambda found, value: found == value,
        "prefix": lambda found, value: found.startswith(value),
        "suffix": lambda found, value: found.endswith(value),
    }[dialect]
    return all(name in attributes and compare(attributes[name], v) for name, v in body.items())


def compiled(binding: dict[str, Any], attributes: dict[str, str]) -> bool:
    raw = {"name": "b", "queue": "q", "subscriber": "http://h/", **binding}
    [settings] = settings_from_dict({"bindings": [raw]}, {}).bindings
    predicate = compile_filter(settings)
    return True if predicate is None else predicate(attributes)


# ------------------------------------------------------------------ the table

EVENT = {
    "specversion": "1.0",
    "id": "e-1",
    "source": "/orders/eu",
    "type": "com.example.order.created",
    "subject": "",
    "region": "eu-west",  # an extension
}

CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("no filter", {}, True),
    ("filter: null", {"filter": None}, True),
    ("empty attributes", {"filter": {"attributes": {}}}, True),
    ("attributes equal", {"filter": {"attributes": {"type": "com.example.order.created"}}}, True),
    ("attributes differ", {"filter": {"attributes": {"type": "com.example.order"}}}, False),
    ("attributes are case-sensitive", {"filter": {"attributes": {"source": "/Orders/eu"}}}, False),
    (
        "all attributes must equal",
        {"filter": {"attributes": {"source": "/orders/eu", "id": "x"}}},
        False,
    ),
    ("extension equal", {"filter": {"attributes": {"region": "eu-west"}}}, True),
    ("missing extension", {"filter": {"attributes": {"tenant": "blue"}}}, False),
    ('"" and present', {"filter": {"attributes": {"region": ""}}}, True),
    ('"" and missing', {"filter": {"attributes": {"tenant": ""}}}, False),
    ('"" and present but empty', {"filter": {"attributes": {"subject": ""}}}, True),
    ("exact", {"filters": [{"exact": {"type": "com.example.order.created"}}]}, True),
    ("exact differs", {"filters": [{"exact": {"type": "com.example.order"}}]}, False),
    ("exact on a missing attribute", {"filters": [{"exact": {"tenant": "blue"}}]}, False),
    ("exact, two attributes", {"filters": [{"exact": {"id": "e-1", "region": "eu-west"}}]}, True),
    ("exact, one of two differs", {"filters": [{"exact": {"id": "e-1", "region": "us"}}]}, False),
    ("prefix", {"filters": [{"prefix": {"type": "com.example."}}]}, True),
    ("prefix is case-sensitive", {"filters": [{"prefix": {"type": "COM.example"}}]}, False),
    ("prefix on a missing attribute", {"filters": [{"prefix": {"tenant": "b"}}]}, False),
    ("suffix", {"filters": [{"suffix": {"type": ".created"}}]}, True),
    ("suffix differs", {"filters": [{"suffix": {"type": ".deleted"}}]}, False),
    ("suffix on a missing attribute", {"filters": [{"suffix": {"tenant": "e"}}]}, False),
    ("suffix on an extension", {"filters": [{"suffix": {"region": "-west"}}]}, True),
    (
        "every entry must pass",
        {"filters": [{"prefix": {"type": "com."}}, {"exact": {"id": "x"}}]},
        False,
    ),
    (
        "all",
        {"filters": [{"all": [{"prefix": {"type": "com."}}, {"suffix": {"source": "/eu"}}]}]},
        True,
    ),
    (
        "all, one fails",
        {"filters": [{"all": [{"prefix": {"type": "com."}}, {"exact": {"id": "x"}}]}]},
        False,
    ),
    (
        "any, one passes",
        {"filters": [{"any": [{"exact": {"id": "x"}}, {"exact": {"id": "e-1"}}]}]},
        True,
    ),
    (
        "any, none passes",
        {"filters": [{"any": [{"exact": {"id": "x"}}, {"exact": {"id": "y"}}]}]},
        False,
    ),
    ("not", {"filters": [{"not": {"exact": {"type": "com.example.order.created"}}}]}, False),
    ("not on a missing attribute", {"filters": [{"not": {"exact": {"tenant": "blue"}}}]}, True),
    (
        "nested three deep",
        {
            "filters": [
                {
                    "any": [
                        {"exact": {"id": "nope"}},
                        {
                            "all": [
                                {"not": {"prefix": {"source": "/payments"}}},
                                {"suffix": {"type": "created"}},
                            ]
                        },
                    ]
                }
            ]
        },
        True,
    ),
    (
        "filters wins over filter",
        {"filter": {"attributes": {"type": "other"}}, "filters": [{"prefix": {"type": "com."}}]},
        True,
    ),
    (
        "filters wins, also to refuse",
        {
            "filter": {"attributes": {"type": "com.example.order.created"}},
            "filters": [{"exact": {"id": "x"}}],
        },
        False,
    ),
    (
        "empty filters: filter applies",
        {"filter": {"attributes": {"id": "x"}}, "filters": []},
        False,
    ),
]


@pytest.mark.parametrize(("binding", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_filter_table(binding: dict[str, Any], expected: bool) -> None:
    assert reference(binding, EVENT) is expected  # the reference agrees with the table
    assert compiled(binding, EVENT) is expected


def test_no_filter_compiles_to_nothing() -> None:
    raw = {"name": "b", "queue": "q", "subscriber": "http://h/", "filter": {"attributes": {}}}
    [binding] = settings_from_dict({"bindings": [raw]}, {}).bindings
    assert compile_filter(binding) is None  # no per-event work at all


# ------------------------------------------------------------------ property

NAMES = st.sampled_from(["type", "source", "subject", "region", "tenant"])
VALUES = st.sampled_from(["a", "ab", "abc", "b", "ba", "A", "abc.x", "x.abc"])

MATCH = st.builds(
    lambda dialect, attributes: {dialect: attributes},
    st.sampled_from(["exact", "prefix", "suffix"]),
    st.dictionaries(NAMES, VALUES, min_size=1, max_size=3),
)
ENTRIES = st.recursive(
    MATCH,
    lambda inner: st.one_of(
        st.builds(
            lambda dialect, entries: {dialect: entries},
            st.sampled_from(["all", "any"]),
            st.lists(inner, min_size=1, max_size=3),
        ),
        st.builds(lambda entry: {"not": entry}, inner),
    ),
    max_leaves=8,
)
BINDINGS = st.fixed_dictionaries(
    {},
    optional={
        "filters": st.lists(ENTRIES, max_size=4),
        "filter": st.builds(
            lambda attributes: {"attributes": attributes},
            st.dictionaries(NAMES, st.one_of(VALUES, st.just("")), max_size=3),
        ),
    },
)
ATTRIBUTES = st.dictionaries(NAMES, st.one_of(VALUES, st.just("")), max_size=5)


@given(binding=BINDINGS, attributes=ATTRIBUTES)
@fuzz_settings(500)
def test_compiled_filters_agree_with_the_reference(binding, attributes) -> None:
    assert compiled(binding, attributes) is reference(binding, attributes)
