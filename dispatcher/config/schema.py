"""The Helm chart's ``config`` schema, generated from the settings models.

``values.schema.json`` used to be written by hand and drifted (it accepted
``backoff_delay: 0``, which the service refuses). Now its ``properties.config``
is derived from the models the loader validates with (``settings``): each
key's ``Accepts`` schema, its description, nested sections, one self-referring
schema of a filter entry (``$defs``, which Helm resolves), plus the few places
where the chart deliberately differs from the service (``CHART_DIFFERENCES``);
the rest of the file (image, probes, ...) is the chart's own and is kept as it is.

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
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Final, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter
from pydantic.fields import FieldInfo

from dispatcher.config.generated import refresh
from dispatcher.config.problems import section_in
from dispatcher.config.settings import FILTER_REF, Settings
from dispatcher.config.validation import Accepts, JsonSchema, filter_entry_schema

CHART_SCHEMA: Final = Path("deploy/helm/dispatcher/values.schema.json")
REGENERATE: Final = "python -m dispatcher.config.schema (or: make schema)"

_TLS_DOC: Final = "Paths of PEM files inside the container (mount them with extraVolumes)"
# Where the chart's values.schema.json keeps the config's schema.
_IN_CHART: Final = "#/properties/config"


def service_schema() -> JsonSchema:
    """A JSON Schema for the service's config file, key for key from the models."""
    schema = _section(Settings)
    schema["$defs"] = {FILTER_REF.rsplit("/", 1)[1]: filter_entry_schema(FILTER_REF)}
    return schema


def _section(shape: type[BaseModel]) -> JsonSchema:
    properties: JsonSchema = {}
    required: list[str] = []
    for name, f in shape.model_fields.items():
        schema = _key(f)
        if f.is_required():
            required.append(name)
        else:
            # null means "the default" to the loader (Helm renders unset values as null).
            schema = _nullable(schema)
        properties[name] = schema
    section: JsonSchema = {"type": "object", "additionalProperties": False}
    section["properties"] = properties
    if required:
        section["required"] = required
    return section


def _key(f: FieldInfo) -> JsonSchema:
    nested = section_in(f.annotation)
    if nested is None:
        accepts = [m for m in f.metadata if isinstance(m, Accepts)]
        schema = copy.deepcopy(accepts[0].schema) if accepts else _typed(f)
        return _described(schema, f)
    schema = _section(nested)
    if get_origin(f.annotation) is tuple:  # bindings: a list of sections
        schema = {"type": "array", "minItems": 1, "items": schema}
    return _described(schema, f)


def _typed(f: FieldInfo) -> JsonSchema:
    """pydantic's own schema of a strict typed key (its bounds, its words); null
    is added by ``_nullable`` like any key's."""
    annotation: Any = f.annotation
    if get_origin(annotation) in (Union, UnionType):
        [annotation] = [a for a in get_args(annotation) if a is not type(None)]
    if f.metadata:
        annotation = Annotated[annotation, *f.metadata]
    return TypeAdapter(annotation).json_schema()


def _described(schema: JsonSchema, f: FieldInfo) -> JsonSchema:
    if f.description is None:
        return schema
    said = schema.get("description")
    return {**schema, "description": f"{f.description}. {said}" if said else f.description}


def _nullable(schema: JsonSchema) -> JsonSchema:
    if "enum" in schema:
        nullable = {**schema, "enum": [*schema["enum"], None]}
        if "type" in schema:
            nullable["type"] = [schema["type"], "null"]
        return nullable
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
    """The chart's schema ``current`` with its ``config`` part regenerated (its
    references pointing where the chart keeps it)."""
    schema = copy.deepcopy(current)
    config = json.dumps(chart_config_schema()).replace('"#/$defs/', f'"{_IN_CHART}/$defs/')
    schema["properties"]["config"] = json.loads(config)
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
    wanted = render(chart_values_schema(json.loads(path.read_text(encoding="utf-8"))))
    return refresh(path, wanted, check=args.check, regenerate=REGENERATE)


if __name__ == "__main__":
    sys.exit(main())
