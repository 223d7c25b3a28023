"""What one key accepts, declared once: the ``Accepts`` marker of its pydantic field.

A settings field is ``Annotated[<type>, Accepts(...)]``: the marker is the
parser pydantic calls (one of ours, ``(value, key) -> typed value``, so
durations, curl-style URLs, headers and filters keep their own messages), the
JSON Schema that says the same for the Helm chart (``schema``), and how
``dispatcher check`` writes the value back (``render``). A marker's schema may
accept more than its parser (JSON Schema cannot say "a duration string of at
least 1s"), never less.

Our parsers name the key they refuse; inside pydantic the key is not known
yet, so they are called with ``HERE`` as the key and whatever they append to it
(``[2]``, ``.Authorization``) travels in the error to ``problems``, which
prefixes pydantic's location. ``refuse`` is the same for the checks that span
a section's fields.

The constructors below (``duration``, ``url``...) build a marker from one
description of the key. Keys that are plain typed values (a boolean, a
bounded integer or number, a string, one of a few words) need no marker:
their field is a strict pydantic type with its bounds, and ``problems``
words pydantic's errors about them as ours always read.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from dispatcher.config import values
from dispatcher.config.durations import ISO_DURATION, NUMBER, UNIT_DURATION
from dispatcher.errors import ConfigError

JsonSchema = dict[str, Any]

# The key our parsers are given inside a model: a character no key path holds.
HERE: Final = "\x00"
# The error type ``problems`` reads back: ``problem`` and the key's ``rest``.
ERROR_TYPE: Final = "dispatcher"


def refuse(rest: str, problem: str) -> NoReturn:
    """Refuse the value at the current location + ``rest`` (``"max_delay"``,
    ``"[2]"``, ``""`` for the location itself) with ``problem``."""
    raise PydanticCustomError(ERROR_TYPE, "{problem}", {"problem": problem, "rest": rest})


def checked(parse: Callable[[object, str], Any], value: object) -> Any:
    """``parse(value)`` with a ConfigError turned into the error pydantic collects."""
    try:
        return parse(value, HERE)
    except ConfigError as err:
        refuse(err.key.removeprefix(HERE), err.problem)


@dataclass(frozen=True)
class Accepts:
    """One key: its parser, its JSON Schema and how ``check`` renders it.

    ``built``: a value of this type is taken as it is (Python callers, tests,
    pass the parsed form, a tuple of pairs or of filter entries, which YAML
    never produces).
    """

    parse: Callable[[object, str], Any]
    schema: JsonSchema
    render: str | None = None
    built: type | None = None

    def __get_pydantic_core_schema__(
        self, _source: Any, _handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self._validate)

    def __get_pydantic_json_schema__(
        self, _core: core_schema.CoreSchema, _handler: GetJsonSchemaHandler
    ) -> JsonSchema:
        return dict(self.schema)

    def _validate(self, value: object) -> Any:
        if self.built is not None and isinstance(value, self.built):
            return value
        return checked(self.parse, value)


# --------------------------------------------------------------------------
# Constructors: the parser and its schema from one description
# --------------------------------------------------------------------------

FILE: Final = Accepts(values.existing_file, {"type": "string", "minLength": 1})


def any_case(word: str) -> str:
    # No (?i): JSON Schema patterns are ECMA-262, Helm's are Go's; both read [xX].
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def choice(options: tuple[str, ...], *, aliases: Mapping[str, str] | None = None) -> Accepts:
    """One of ``options`` in any case (``LOG_LEVEL=DEBUG``), or an alias of one. A
    key whose words must be written as they are is a ``Literal`` type instead."""
    parse = values.choice(options, aliases=aliases)
    words = [*options, *(aliases or {})]
    pattern = f"^({'|'.join(map(any_case, words))})$"
    return Accepts(parse, {"type": "string", "pattern": pattern})


_DURATION_DOC: Final = "Duration: 250ms, 1.5s, 2m, 1m30s, ISO-8601 (PT0.25S) or a number of seconds"


def _duration_pattern() -> str:
    """The strings ``parse_duration`` reads, from its own regular expressions
    (named groups unnamed: Go's and ECMA-262's syntaxes differ there)."""
    iso = re.sub(r"\(\?P<[A-Z]>", "(", ISO_DURATION.pattern)
    forms = "|".join((NUMBER, UNIT_DURATION.pattern, iso))
    return rf"^\s*[-+]?({forms})\s*$"


def duration(
    parse: Callable[[object, str], float],
    minimum: float,
    *,
    positive: bool = False,
    maximum: float | None = None,
) -> Accepts:
    seconds: JsonSchema = {"type": "number"}
    written: JsonSchema = {"type": "string", "pattern": _duration_pattern()}
    if positive:
        seconds["exclusiveMinimum"] = minimum
        # "0s", "PT0S", "0.000": no digit but 0 means zero, which is refused.
        written = {"allOf": [written, {"pattern": "[1-9]"}]}
    else:
        seconds["minimum"] = minimum
    if maximum is not None:
        seconds["maximum"] = maximum
    schema = {"description": _DURATION_DOC, "anyOf": [seconds, written]}
    return Accepts(parse, schema, render="duration")


def size() -> Accepts:
    units = "|".join(any_case(u) for u in sorted(values.SIZE_UNITS, key=len, reverse=True) if u)
    written = {"type": "string", "pattern": rf"^\s*[0-9]*[1-9][0-9]*\s*({units})?\s*$"}
    return Accepts(values.size, {"anyOf": [{"type": "integer", "minimum": 1}, written]}, "size")


def url(parse: Callable[[object, str], object], *schemes: str) -> Accepts:
    names = "|".join(any_case(name) for name in schemes)
    schema = {"type": "string", "pattern": rf"^\s*({names})://[^/?#\s]"}
    return Accepts(parse, schema, render="url")


def url_list(parse: Callable[[object, str], object], *schemes: str) -> Accepts:
    """One URL or a non-empty list of them (a cluster's nodes)."""
    one = url(parse, *schemes).schema
    schema = {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]}
    return Accepts(parse, schema, render="url", built=tuple)


def attributes_schema(*, non_empty: bool) -> JsonSchema:
    value: JsonSchema = {"type": "string", "minLength": 1} if non_empty else {"type": "string"}
    schema: JsonSchema = {
        "type": "object",
        "propertyNames": {"pattern": f"^{values.ATTRIBUTE_NAME.pattern}$"},
        "additionalProperties": value,
    }
    return {**schema, "minProperties": 1} if non_empty else schema


def filter_entry_schema(ref: str) -> JsonSchema:
    """One ``filters`` entry; ``ref`` points at this schema itself, for the
    nesting dialects (all, any, not) at any depth."""
    nested = {"type": "array", "minItems": 1, "items": {"$ref": ref}}
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
            "not": {"$ref": ref},
            "cesql": {"type": "string", "minLength": 1},
        },
    }
