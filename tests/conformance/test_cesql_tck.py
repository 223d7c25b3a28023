"""The CloudEvents specification's own CESQL test kit, every case, as data.

The YAML files in ``cesql_tck/`` are the kit as published (``SOURCE`` says
where from). Each case names an expression, an event (or overrides of a valid
one), the expected value and the expected error. An expression that cannot be
compiled (a syntax error, a call no function answers) is refused when the
configuration is read, so those cases expect ``parse`` to refuse it with that
kind; every other case is evaluated, and the filter built from it must pass
exactly when the value is ``true`` with no error.

The kit's events carry typed values (JSON numbers and booleans). The service
reads an event as the strings that would be sent, whichever way it came, so
every case is also run the way the service meets it: the case's event as an
AMQP message in each content mode (binary with typed AMQP headers, binary with
text headers as Knative's ingress writes them, structured JSON), read by the
service's AMQP binding and judged by the binding's compiled filter; each must
decide as the kit does (issue 41).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cesql import CesqlError, parse
from dispatcher.config import settings_from_dict
from dispatcher.delivery.filters import compile_filter
from dispatcher.event import amqp as amqp_binding
from dispatcher.event.cloudevent import AmqpMessage

KIT = Path(__file__).with_name("cesql_tck")

# Every required attribute, for the cases that give none or only overrides.
VALID_EVENT = {"specversion": "1.0", "id": "tck-1", "source": "/tck", "type": "tck.case"}


class _KitLoader(yaml.SafeLoader):
    """YAML as the kit means it: its events are JSON, so an unquoted timestamp is
    the string it spells, not a datetime."""


_KitLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _cases() -> list[Any]:
    found = []
    for path in sorted(KIT.glob("*.yaml")):
        suite = yaml.load(path.read_text(), Loader=_KitLoader)
        for case in suite["tests"]:
            found.append(pytest.param(case, id=f"{path.stem}: {case['name']}"))
    return found


CASES = _cases()
PARSE_ERRORS = ("parse", "missingFunction")  # refused when the configuration is read
BINDING = {"name": "tck", "queue": "q", "subscriber": "http://127.0.0.1:9/"}


def _attributes(case: dict[str, Any]) -> dict[str, Any]:
    event = dict(case.get("event") or VALID_EVENT)
    event.update(case.get("eventOverrides") or {})
    return event


@pytest.mark.parametrize("case", CASES)
def test_cesql_tck(case: dict[str, Any]) -> None:
    expression, error = str(case["expression"]), case.get("error")
    if error in PARSE_ERRORS:
        with pytest.raises(CesqlError) as refused:
            parse(expression)
        assert refused.value.kind == error
        return
    compiled = parse(expression)
    attributes = _attributes(case)
    value, kind = compiled.evaluate(attributes)
    assert kind == error
    if "result" in case:
        assert value == case["result"] and type(value) is type(case["result"])
    assert compiled.passes(attributes) is (error is None and value is True)


def test_the_kit_is_all_here() -> None:
    """Every file of the kit is run, and none is empty: a kit fetched by halves
    would otherwise pass by testing less."""
    assert len(list(KIT.glob("*.yaml"))) == 18
    assert len(CASES) >= 250


def _as_text(value: Any) -> str:
    """A value as a binary-mode text header carries it (JSON's spelling of a Boolean)."""
    return value if isinstance(value, str) else json.dumps(value)


CONTENT_MODES = {
    "binary": lambda event: AmqpMessage(b"", {f"ce-{k}": v for k, v in event.items()}),
    "binary-text": lambda event: AmqpMessage(
        b"", {f"ce-{k}": _as_text(v) for k, v in event.items()}
    ),
    "structured": lambda event: AmqpMessage(
        json.dumps(event).encode(), {}, "application/cloudevents+json"
    ),
}
EVALUATED = [case for case in CASES if case.values[0].get("error") not in PARSE_ERRORS]


@pytest.mark.parametrize("mode", sorted(CONTENT_MODES))
@pytest.mark.parametrize("case", EVALUATED)
def test_the_kit_through_the_service(case: dict[str, Any], mode: str) -> None:
    expression = str(case["expression"])
    value, error = parse(expression).evaluate(_attributes(case))
    [binding] = settings_from_dict(
        {"bindings": [{**BINDING, "filters": [{"cesql": expression}]}]}, {}
    ).bindings
    accepts = compile_filter(binding)
    assert accepts is not None
    event, problem = amqp_binding.read(
        CONTENT_MODES[mode](_attributes(case)), "/", "q", binding.non_cloudevent
    )
    assert problem is None
    assert accepts(event.attributes) is (error is None and value is True)
