"""The CloudEvents specification's own CESQL test kit, every case, as data.

The YAML files in ``cesql_tck/`` are the kit as published (``SOURCE`` says
where from). Each case names an expression, an event (or overrides of a valid
one), the expected value and the expected error. An expression that cannot be
compiled (a syntax error, a call no function answers) is refused when the
configuration is read, so those cases expect ``parse`` to refuse it with that
kind; every other case is evaluated, and the filter built from it must pass
exactly when the value is ``true`` with no error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cesql import CesqlError, parse

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


def _attributes(case: dict[str, Any]) -> dict[str, Any]:
    event = dict(case.get("event") or VALID_EVENT)
    event.update(case.get("eventOverrides") or {})
    return event


@pytest.mark.parametrize("case", CASES)
def test_cesql_tck(case: dict[str, Any]) -> None:
    expression, error = str(case["expression"]), case.get("error")
    if error in ("parse", "missingFunction"):
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
