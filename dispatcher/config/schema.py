"""The Helm chart's ``config`` schema, generated from the service's own rule table.

``values.schema.json`` used to be written by hand and drifted (it accepted
``backoff_delay: 0``, which the service refuses). Now its ``properties.config``
is derived from ``rules.rule_table()``, the rules the loader
validates with, plus the few places where the chart deliberately differs from
the service (``CHART_DIFFERENCES``); the rest of the file (image, probes, ...)
is the chart's own and is kept as it is.

    python -m dispatcher.config.schema           # rewrite the chart's schema
    python -m dispatcher.config.schema --check   # exit 1 when it is out of date

``make schema`` runs the first; a unit test runs the second's logic.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Final

from dispatcher.config.rules import rule_table
from dispatcher.config.settings import Settings
from dispatcher.config.validation import JsonSchema, ListRule, SectionRule

CHART_SCHEMA: Final = Path("deploy/helm/dispatcher/values.schema.json")
REGENERATE: Final = "python -m dispatcher.config.schema (or: make schema)"

_TLS_DOC: Final = "Paths of PEM files inside the container (mount them with extraVolumes)"


def service_schema() -> JsonSchema:
    """A JSON Schema for the service's config file, rule for rule."""
    return _section(Settings)


def _section(shape: type) -> JsonSchema:
    rules = rule_table()[shape]
    properties: JsonSchema = {}
    required: list[str] = []
    for f in fields(shape):
        rule = rules[f.name]
        if isinstance(rule, SectionRule):
            schema = _section(rule.shape)
        elif isinstance(rule, ListRule):
            assert rule.item is not None
            schema = {**rule.schema, "items": _section(rule.item.shape)}
        else:
            schema = copy.deepcopy(rule.schema)
        if isinstance(rule, ListRule) or (f.default is MISSING and f.default_factory is MISSING):
            required.append(f.name)
        else:
            # null means "the default" to the loader (Helm renders unset values as null).
            schema = _nullable(schema)
        properties[f.name] = schema
    section: JsonSchema = {"type": "object", "additionalProperties": False}
    section["properties"] = properties
    if required:
        section["required"] = required
    return section


def _nullable(schema: JsonSchema) -> JsonSchema:
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    kind = schema.get("type")
    if isinstance(kind, str) and "pattern" not in schema and "allOf" not in schema:
        return {**schema, "type": [kind, "null"]}
    if "anyOf" in schema:
        return {**schema, "anyOf": [{"type": "null"}, *schema["anyOf"]]}
    return {"anyOf": [{"type": "null"}, schema]}


def chart_config_schema() -> JsonSchema:
    """``service_schema`` with the chart's deliberate differences applied."""
    schema = service_schema()
    for path, change in CHART_DIFFERENCES:
        node = schema
        for name in path[:-1]:
            node = node["items"] if name == "[]" else node["properties"][name]
        if path[-1] == "required":
            node["required"] = change
        else:
            target = node["properties"]
            target[path[-1]] = change(target[path[-1]])
    schema["description"] = (
        "The service's config file (config/dispatcher.example.yaml), without broker.url "
        "or dedupe.store"
    )
    return schema


def _url_refused(_: JsonSchema) -> JsonSchema:
    # The chart's template refuses it with a message naming brokerSecret.
    return {
        "description": "Not allowed: the URL carries the password and comes only from "
        "brokerSecret. Left out of this schema's checks so the chart can explain that "
        "when it refuses it."
    }


def _store_refused(_: JsonSchema) -> JsonSchema:
    # As broker.url: the template refuses a URL and names dedupeStoreSecret.
    return {
        "description": "Not allowed (but null): the store's URL may carry a password and "
        "comes only from dedupeStoreSecret. Left out of this schema's checks so the chart "
        "can explain that when it refuses it."
    }


def _tls_documented(schema: JsonSchema) -> JsonSchema:
    return {**schema, "description": _TLS_DOC}


def _grace_for_the_chart(schema: JsonSchema) -> JsonSchema:
    # The chart computes terminationGracePeriodSeconds from the grace in its
    # template, which reads Go-style durations and seconds, not ISO-8601.
    return {
        "description": "After SIGTERM, in-flight work gets this long; "
        "terminationGracePeriodSeconds is this + 10 s. Go-style duration or seconds "
        "(not ISO-8601: the chart must compute with it)",
        "anyOf": [
            {"type": "number", "minimum": 0},
            {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?|([0-9]+(\.[0-9]+)?(ms|s|m|h))+)$"},
        ],
    }


# (path in the config, change): where the chart asks more of a value than the
# service does, never less. A binding's subscriber is required by the chart's
# own "standalone" rule; in sidecar mode the chart fills it in.
CHART_DIFFERENCES: Final[Sequence[tuple[tuple[str, ...], Any]]] = (
    (("broker", "url"), _url_refused),
    (("dedupe", "store"), _store_refused),
    (("broker", "tls"), _tls_documented),
    (("bindings", "[]", "tls"), _tls_documented),
    (("shutdown", "grace"), _grace_for_the_chart),
    (("bindings", "[]", "required"), ["name", "queue"]),
)


def chart_values_schema(current: JsonSchema) -> JsonSchema:
    """The chart's schema ``current`` with its ``config`` part regenerated."""
    schema = copy.deepcopy(current)
    schema["properties"]["config"] = chart_config_schema()
    return schema


def render(schema: JsonSchema) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatcher.config.schema",
        description="Regenerate the config part of the Helm chart's values.schema.json.",
    )
    parser.add_argument("--chart-schema", type=Path, default=CHART_SCHEMA)
    parser.add_argument(
        "--check", action="store_true", help="exit 1, changing nothing, when out of date"
    )
    args = parser.parse_args(argv)
    path: Path = args.chart_schema
    text = path.read_text(encoding="utf-8")
    wanted = render(chart_values_schema(json.loads(text)))
    if text == wanted:
        return 0
    if args.check:
        print(f"{path} is out of date: run {REGENERATE}", file=sys.stderr)
        return 1
    path.write_text(wanted, encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
