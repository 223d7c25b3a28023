"""How a section of the configuration is read, and the kinds of rule a key can have.

A ``Section`` is one mapping of the file (``broker``, ``bindings[0].delivery``)
whose keys must be the fields of one settings dataclass; it names every key
it reports by its full path. A ``Rule`` is what one key accepts, said twice:
as the parser the loader calls and as the JSON Schema that says the same, so
the service and the Helm chart's schema (``schema``) cannot drift apart. A
rule's schema may accept more than the service (JSON Schema cannot say "a
duration string of at least 1s"), never less.

The rule constructors below (``text_rule``, ``duration_rule``...) build both
halves from one description; ``rules`` assigns one to every key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields
from typing import TYPE_CHECKING, Any, Final, TypeVar

from dispatcher.config import values
from dispatcher.config.durations import ISO_DURATION, NUMBER, UNIT_DURATION
from dispatcher.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

JsonSchema = dict[str, Any]


class Section:
    """A mapping at ``key`` whose keys must be the fields of ``shape``."""

    def __init__(self, raw: object, key: str, shape: type[DataclassInstance]) -> None:
        self.key = key
        self._raw = values.mapping(raw, key)
        allowed = sorted(f.name for f in fields(shape))
        for name in self._raw:
            if name not in allowed:
                raise ConfigError(
                    self.sub(values.written(name)),
                    f"unknown key (expected one of: {', '.join(allowed)})",
                )

    def sub(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def raw(self, name: str) -> object:
        return self._raw.get(name)

    def get(self, name: str, parse: Callable[[object, str], T], default: T) -> T:
        # null means "use the default": Helm templates render unset values as null.
        value = self._raw.get(name)
        return default if value is None else parse(value, self.sub(name))

    def optional(self, name: str, parse: Callable[[object, str], T]) -> T | None:
        value = self._raw.get(name)
        return None if value is None else parse(value, self.sub(name))

    def require(self, name: str, parse: Callable[[object, str], T]) -> T:
        value = self._raw.get(name)
        if value is None:
            raise ConfigError(self.sub(name), "required")
        return parse(value, self.sub(name))

    def nested(self, name: str, build: Callable[[object, str], T]) -> T:
        return build(self._raw.get(name), self.sub(name))


@dataclass(frozen=True)
class Rule:
    """One key: the parser the loader calls and the JSON Schema saying the same."""

    parse: Callable[[object, str], Any]
    schema: JsonSchema

    def read(self, s: Section, f: Field[Any]) -> Any:
        if f.default is MISSING and f.default_factory is MISSING:
            return s.require(f.name, self.parse)
        if f.default is None:
            return s.optional(f.name, self.parse)
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        return s.get(f.name, self.parse, default)


@dataclass(frozen=True)
class SectionRule(Rule):
    """A nested mapping: ``shape``'s fields, each with its own rule."""

    shape: type = object

    def read(self, s: Section, f: Field[Any]) -> Any:
        if f.default is None:  # ``declare: null`` (or absent) means "no section"
            return s.optional(f.name, self.parse)
        return s.nested(f.name, self.parse)  # null or absent: every default


@dataclass(frozen=True)
class ListRule(Rule):
    """A list of ``item`` sections; required, whatever the field's default says
    (a service with no binding has nothing to do)."""

    item: SectionRule | None = None

    def read(self, s: Section, f: Field[Any]) -> Any:
        return self.parse(s.raw(f.name), s.sub(f.name))


# --------------------------------------------------------------------------
# Rule constructors: the parser and its schema from one description
# --------------------------------------------------------------------------


def text_rule(*, non_empty: bool = False, max_bytes: int | None = None) -> Rule:
    schema: JsonSchema = {"type": "string"}
    parse: Callable[[object, str], str] = values.non_empty_string if non_empty else values.string
    if non_empty:
        schema["minLength"] = 1
    if max_bytes is not None:
        schema["maxLength"] = max_bytes  # characters <= bytes: never refuses a valid name
        parse = values.queue_name  # the AMQP limit, in bytes
    return Rule(parse, schema)


def integer_rule(minimum: int, maximum: int | None = None) -> Rule:
    if maximum is None:
        return Rule(values.int_at_least(minimum), {"type": "integer", "minimum": minimum})
    schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    return Rule(values.int_between(minimum, maximum), schema)


def number_rule(low: float, high: float | None = None, *, low_open: bool = False) -> Rule:
    schema: JsonSchema = {"type": "number"}
    schema["exclusiveMinimum" if low_open else "minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return Rule(values.number_in(low, high, low_open=low_open), schema)


def _any_case(word: str) -> str:
    # No (?i): JSON Schema patterns are ECMA-262, Helm's are Go's; both read [xX].
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def choice_rule(
    options: tuple[str, ...], *, lower: bool = False, aliases: Mapping[str, str] | None = None
) -> Rule:
    parse = values.choice(options, lower=lower, aliases=aliases)
    words = [*options, *(aliases or {})]
    if not lower:
        return Rule(parse, {"enum": words})
    return Rule(parse, {"type": "string", "pattern": f"^({'|'.join(map(_any_case, words))})$"})


_DURATION_DOC: Final = "Duration: 250ms, 1.5s, 2m, 1m30s, ISO-8601 (PT0.25S) or a number of seconds"


def _duration_pattern() -> str:
    """The strings ``parse_duration`` reads, from its own regular expressions
    (named groups unnamed: Go's and ECMA-262's syntaxes differ there)."""
    iso = re.sub(r"\(\?P<[A-Z]>", "(", ISO_DURATION.pattern)
    forms = "|".join((NUMBER, UNIT_DURATION.pattern, iso))
    return rf"^\s*[-+]?({forms})\s*$"


def duration_rule(
    parse: Callable[[object, str], float],
    minimum: float,
    *,
    positive: bool = False,
    maximum: float | None = None,
) -> Rule:
    number: JsonSchema = {"type": "number"}
    text: JsonSchema = {"type": "string", "pattern": _duration_pattern()}
    if positive:
        number["exclusiveMinimum"] = minimum
        # "0s", "PT0S", "0.000": no digit but 0 means zero, which is refused.
        text = {"allOf": [text, {"pattern": "[1-9]"}]}
    else:
        number["minimum"] = minimum
    if maximum is not None:
        number["maximum"] = maximum
    return Rule(parse, {"description": _DURATION_DOC, "anyOf": [number, text]})


def size_rule() -> Rule:
    units = "|".join(_any_case(u) for u in sorted(values.SIZE_UNITS, key=len, reverse=True) if u)
    text = {"type": "string", "pattern": rf"^\s*[0-9]*[1-9][0-9]*\s*({units})?\s*$"}
    return Rule(values.size, {"anyOf": [{"type": "integer", "minimum": 1}, text]})


def url_rule(parse: Callable[[object, str], object], *schemes: str) -> Rule:
    names = "|".join(_any_case(name) for name in schemes)
    return Rule(parse, {"type": "string", "pattern": rf"^\s*({names})://[^/?#\s]"})


def url_list_rule(parse: Callable[[object, str], object], *schemes: str) -> Rule:
    """One URL or a non-empty list of them (a cluster's nodes)."""
    one = url_rule(parse, *schemes).schema
    return Rule(parse, {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]})


FILE_RULE: Final = Rule(values.existing_file, {"type": "string", "minLength": 1})


def attributes_schema(*, non_empty: bool) -> JsonSchema:
    value: JsonSchema = {"type": "string", "minLength": 1} if non_empty else {"type": "string"}
    schema: JsonSchema = {
        "type": "object",
        "propertyNames": {"pattern": f"^{values.ATTRIBUTE_NAME.pattern}$"},
        "additionalProperties": value,
    }
    return {**schema, "minProperties": 1} if non_empty else schema


# JSON Schema without references cannot recurse: the schema checks this many
# levels of all/any/not, and the service checks any deeper ones at start.
_FILTER_SCHEMA_DEPTH: Final = 2


def filter_entry_schema(depth: int = _FILTER_SCHEMA_DEPTH) -> JsonSchema:
    if depth == 0:
        return {"type": "object"}
    inner = filter_entry_schema(depth - 1)
    nested = {"type": "array", "minItems": 1, "items": inner}
    match = attributes_schema(non_empty=True)
    return {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
        "properties": {
            "exact": match,
            "prefix": match,
            "suffix": match,
            "all": nested,
            "any": nested,
            "not": inner,
            "cesql": {"type": "string", "minLength": 1},
        },
    }
