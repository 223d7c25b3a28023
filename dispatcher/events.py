"""The CloudEvent as dispatcher forwards it, its validation, and the JSON event format.

An ``Event`` keeps attributes as strings and data as the exact bytes received:
a dispatcher forwards events, so it must not re-serialise a subscriber's
payload or invent attributes. That is why the hot path does not build
``cloudevents.core.v1.event.CloudEvent`` objects for forwarding (its
constructor adds a fresh ``time`` when none is given and its JSON format
decodes and re-encodes data); the library is used where it adds value: as the
validator of required attributes and extension names.

Here too: the plain values that cross into and out of the core
(``AmqpMessage``, ``HttpRequestParts``, ``Unreadable``), attribute text (any
header or JSON value as an attribute string; times written one way), the
``ce-`` headers an event is published with, and the JSON event format both
ways (structured mode, archive lines) with ``strict_json``, its parser. The
JSON format is why this module is a little
over 400 lines: it is the Event's own serialised form, read and written by the
service, ``archive`` and ``replay`` alike.

Where a message becomes a CloudEvent: ``dispatcher/from_amqp.py``; an event
becomes an HTTP request, and a reply an event: ``dispatcher/http_form.py``.
None of the three imports pika, pycurl or redis.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse

from dispatcher.errors import EventError

SPECVERSION: Final = "1.0"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# Attributes the JSON format requires to be strings (extensions may be numbers or booleans).
_STRING_ATTRIBUTES: Final = frozenset(
    {"specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"}
)


# --------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Event:
    """A CloudEvent as dispatcher forwards it: string attributes and raw data bytes."""

    attributes: Mapping[str, str]
    data: bytes | None

    @property
    def id(self) -> str:
        return self.attributes["id"]

    @property
    def source(self) -> str:
        return self.attributes["source"]

    @property
    def type(self) -> str:
        return self.attributes["type"]

    @property
    def key(self) -> tuple[str, str]:
        """(source, id): what identifies an event for duplicate detection."""
        return (self.attributes["source"], self.attributes["id"])

    def with_extensions(self, extensions: Mapping[str, str]) -> Event:
        return Event({**self.attributes, **extensions}, self.data)


@dataclass(frozen=True, slots=True)
class AmqpMessage:
    """The parts of an AMQP delivery that the mapping reads (pika-independent)."""

    body: bytes
    headers: Mapping[str, Any]
    content_type: str | None = None
    message_id: str | None = None
    # The remaining basic properties (pika's BasicProperties, or any object with
    # those attributes), read only to digest a wrapped message's id: kept as
    # received rather than copied for every message.
    properties: Any = None


@dataclass(frozen=True, slots=True)
class HttpRequestParts:
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why the properties of a message could not be read, and their bytes as received."""

    error: str
    properties: bytes


# --------------------------------------------------------------------- attribute text


def attribute_text(name: str, value: Any) -> str:
    """Render a header or JSON value (any type pika decodes) as an attribute string."""
    text: str
    if type(value) is str:  # by far the commonest: first
        text = value
    elif isinstance(value, bool):  # before int: bool is an int
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, bytes):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as e:
            raise EventError(f"header {name!r} is not valid UTF-8") from e
    elif isinstance(value, int | decimal.Decimal):
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, dt.datetime):
        text = format_time(value)
    else:
        raise EventError(
            f"header {name!r} has type {type(value).__name__}, which no CloudEvents attribute has"
        )
    return _clean(name, text)


def _clean(name: str, text: str) -> str:
    # isprintable() (C) says yes for almost every value; only a no needs the regex.
    if not text.isprintable() and _CONTROL.search(text):
        raise EventError(f"header {name!r} contains control characters (CR, LF or other)")
    return text


def format_time(value: dt.datetime) -> str:
    # pika decodes AMQP timestamps as naive datetimes in UTC.
    aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    text = aware.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def header_safe_media_type(content_type: str) -> bool:
    """Whether ``content_type`` can be a datacontenttype: it becomes the HTTP
    Content-Type header, which is ASCII."""
    return content_type.isascii() and content_type.isprintable()


# --------------------------------------------------------------------- validation


def validated(attributes: dict[str, str], data: bytes | None) -> Event:
    """Check attributes against CloudEvents 1.0, using the SDK's validator."""
    specversion = attributes.get("specversion")
    if specversion != SPECVERSION:
        raise EventError(f"unsupported specversion {specversion!r} (only 1.0 is accepted)")
    # The SDK's constructor invents a missing id (uuid4) and time (now), so
    # presence must be checked here: an event without an id is malformed.
    missing = [name for name in ("id", "source", "type") if not attributes.get(name)]
    if missing:
        raise EventError(f"missing required attribute(s): {', '.join(missing)}")
    content_type = attributes.get("datacontenttype")
    if content_type is not None and not header_safe_media_type(content_type):
        raise EventError(f"datacontenttype {content_type!r} is not a printable ASCII media type")
    typed: dict[str, Any] = dict(attributes)
    if "time" in typed:
        try:
            typed["time"] = isoparse(typed["time"])
        except (ValueError, OverflowError) as e:
            raise EventError(
                f"attribute 'time' is not an RFC 3339 timestamp: {typed['time']!r}"
            ) from e
        if typed["time"].tzinfo is None:
            raise EventError("attribute 'time' has no time zone")
    names = frozenset(attributes)
    # Given non-empty string values (and the checks above), the SDK's verdict
    # depends only on the attribute names: a set of names it accepted once is
    # not sent through it again (it was a tenth of a delivery's CPU).
    if names in _ACCEPTED_NAMES and all(attributes.values()):
        return Event(attributes, data)
    try:
        # The SDK validates in its constructor (names, types, time zone). It
        # writes into the dict it is given, so it gets a copy.
        CloudEvent(typed)
    except BaseCloudEventException as e:  # derives from Exception: ValueError would miss it
        raise EventError(f"invalid CloudEvent: {_sdk_reason(e)}") from e
    if len(_ACCEPTED_NAMES) < _ACCEPTED_NAMES_MAX:
        _ACCEPTED_NAMES.add(names)
    return Event(attributes, data)


# Attribute-name sets the SDK accepted; bounded, as senders may invent extensions.
_ACCEPTED_NAMES: set[frozenset[str]] = set()
_ACCEPTED_NAMES_MAX: Final = 1024


def _sdk_reason(error: BaseCloudEventException) -> str:
    # The SDK reports up to three problems per attribute (missing, empty, wrong
    # type); the first one says it.
    errors = getattr(error, "errors", None)
    if isinstance(errors, dict) and errors:
        return "; ".join(str(problems[0]) for problems in errors.values() if problems)
    return str(error)


# --------------------------------------------------------------------- strict JSON


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


_STRICT_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)


def strict_json(data: bytes | str) -> Any:
    """``json.loads`` that refuses NaN/Infinity and turns every failure into ValueError.

    A hostile document nested 100k deep raises RecursionError in the stdlib
    parser; it is bad input like any other.
    """
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError as e:
        raise ValueError("nested too deeply") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8: {e}") from e


# --------------------------------------------------------------------- JSON format -> Event


def from_structured(content_type: str, body: bytes) -> Event:
    """The event of a structured-mode body (an AMQP message's or an HTTP reply's)."""
    if not content_type.lower().startswith(STRUCTURED_CONTENT_TYPE):
        raise EventError(f"unsupported structured content type {content_type!r}")
    try:
        document = strict_json(body)
    except ValueError as e:
        raise EventError(f"structured event is not valid JSON: {e}") from e
    if not isinstance(document, dict):
        raise EventError("structured event is not a JSON object")
    return from_json_document(document, body)


def from_json_document(document: dict[str, Any], text: str | bytes | None = None) -> Event:
    """Build an Event from a JSON-format CloudEvent document (already parsed).

    With ``text``, the document's source, JSON data keeps the exact bytes it
    was written with (number precision, spacing, escapes) instead of being
    re-encoded from the parsed value.
    """
    if "data" in document and "data_base64" in document:
        raise EventError("structured event has both data and data_base64")
    attributes = _json_attributes(document)
    data = _json_data(document, attributes.get("datacontenttype"), text)
    return validated(attributes, data)


def _json_attributes(document: dict[str, Any]) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for name, value in document.items():
        if name in ("data", "data_base64") or value is None:
            continue
        if name in _STRING_ATTRIBUTES and not isinstance(value, str):
            raise EventError(f"attribute {name!r} must be a JSON string")
        if isinstance(value, dict | list):
            raise EventError(f"attribute {name!r} must be a string, number or boolean")
        text = value if isinstance(value, str) else attribute_text(name, value)
        attributes[name] = _clean(name, text)
    return attributes


def _json_data(
    document: dict[str, Any], content_type: str | None, text: str | bytes | None
) -> bytes | None:
    if "data_base64" in document:
        encoded = document["data_base64"]
        if not isinstance(encoded, str):
            raise EventError("data_base64 must be a string")
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise EventError("data_base64 is not valid base64") from e
    if "data" not in document:
        return None
    value = document["data"]
    if isinstance(value, str) and not _is_json(content_type):
        return value.encode("utf-8")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            text = None  # UTF-16/32 JSON (json.loads reads it): re-encode instead
    if text is not None:
        raw = _raw_member(text, "data")
        if raw is not None:
            return raw.encode("utf-8")
    # Without the source text, JSON data can only be re-encoded from its value.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_JSON_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


def _raw_member(text: str, name: str) -> str | None:
    """The exact source text of top-level member ``name`` of a JSON object (the last one
    when repeated, as ``json.loads`` keeps); ``text`` has already parsed as one."""
    # scan_once (public, undocumented in typeshed) parses one value at an index.
    scan: Callable[[str, int], tuple[Any, int]] = _STRICT_DECODER.scan_once  # type: ignore[attr-defined]
    found = None
    try:
        position = _skip_space(text, 0) + 1  # past "{"
        while text[_skip_space(text, position)] != "}":
            key, position = scan(text, _skip_space(text, position))
            start = _skip_space(text, _skip_space(text, position) + 1)  # past ":"
            _value, position = scan(text, start)
            if key == name:
                found = text[start:position]
            position = _skip_space(text, position)
            if text[position] == ",":
                position += 1
    except (StopIteration, ValueError, IndexError, RecursionError):
        return None  # cannot happen for parsed text; re-encoding is the safe fallback
    return found


def _skip_space(text: str, position: int) -> int:
    match = _JSON_WHITESPACE.match(text, position)
    return match.end() if match else position


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True  # the JSON event format's default
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json") or media == "text/json"


# --------------------------------------------------------------------- Event -> JSON format


def to_json(event: Event) -> bytes:
    """The JSON event format; data embedded as JSON when it is JSON, else text or base64.

    JSON data is spliced in byte for byte (after checking it parses), never
    decoded and re-encoded: numbers keep their precision and keys their order.
    """
    document: dict[str, Any] = dict(event.attributes)
    data = event.data
    raw_json: bytes | None = None
    if data is not None:
        content_type = event.attributes.get("datacontenttype")
        if _is_json(content_type) and _parses(data):
            raw_json = data.strip()
        elif content_type and content_type.lower().startswith("text/") and _utf8(data):
            document["data"] = data.decode("utf-8")
        else:
            document["data_base64"] = base64.b64encode(data).decode("ascii")
    encoded = json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if raw_json is None:
        return encoded
    return encoded[:-1] + b',"data":' + raw_json + b"}"


def _parses(data: bytes) -> bool:
    """Whether ``data`` can be spliced into a UTF-8 JSON document as it is.

    Plain UTF-8 only: ``json.loads`` would also take a BOM or UTF-16, whose
    bytes spliced in would corrupt the document (such data goes as base64).
    """
    try:
        strict_json(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --------------------------------------------------------------------- Event -> AMQP


def to_amqp_headers(event: Event) -> tuple[dict[str, str], str | None]:
    """Binary ``ce-`` header form (the one ``from_amqp`` reads first) plus the content
    type: how the publisher and ``replay`` put an event on an exchange."""
    headers = {"ce-" + k: v for k, v in event.attributes.items() if k != "datacontenttype"}
    return headers, event.attributes.get("datacontenttype")
