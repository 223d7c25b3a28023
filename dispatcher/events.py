"""Where a message becomes a CloudEvent, and a CloudEvent becomes HTTP or AMQP.

An ``Event`` keeps attributes as strings and data as the exact bytes received:
a dispatcher forwards events, so it must not re-serialise a subscriber's
payload or invent attributes. That is why the hot path does not build
``cloudevents.core.v1.event.CloudEvent`` objects for forwarding (its
constructor adds a fresh ``time`` when none is given and its JSON format
decodes and re-encodes data); the library is used where it adds value: as the
validator of required attributes and extension names.

Accepted AMQP forms (first match wins):

- binary, attributes in headers named ``ce-<attr>``, ``cloudEvents_<attr>``,
  ``cloudEvents:<attr>`` or bare ``<attr>`` (as the Knative ingress writes);
  the ``content_type`` property is ``datacontenttype``, the body is the data;
- structured, ``content_type`` starting with ``application/cloudevents``
  (JSON event format);
- anything else is not a CloudEvent: ``NotACloudEvent``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote, unquote

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse

from dispatcher.errors import EventError, NotACloudEvent

SPECVERSION: Final = "1.0"
WRAPPED_TYPE: Final = "dev.dispatcher.rabbitmq.message"
STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"
TRACE_HEADERS: Final = ("traceparent", "tracestate")

# Header prefixes of the binary forms, lower-cased; the bare form has none.
_PREFIXES: Final = ("ce-", "cloudevents_", "cloudevents:")
_ATTR_NAME: Final = re.compile(r"^[a-z0-9]{1,64}$")
# Headers the broker adds or changes on redelivery; an id derived from them
# would not be stable.
_VOLATILE_HEADERS: Final = frozenset(
    {
        "x-delivery-count",
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)
# Basic properties that identify a message across redeliveries (the wrapped id).
_IDENTITY_PROPERTIES: Final = (
    "content_encoding",
    "correlation_id",
    "reply_to",
    "timestamp",
    "type",
    "app_id",
    "user_id",
)
# The CloudEvents HTTP binding (3.1.3.2): printable ASCII except space, '"' and '%'.
_HTTP_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
_NEEDS_QUOTING: Final = re.compile("[^" + re.escape(_HTTP_SAFE) + "]")
# Attributes the JSON format requires to be strings (extensions may be numbers or booleans).
_STRING_ATTRIBUTES: Final = frozenset(
    {"specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"}
)


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


def amqp_message(body: bytes, properties: Any) -> AmqpMessage:
    """The message as received: ``properties`` is pika's BasicProperties (or alike).

    pika hands over a header name, ``content_type`` or ``message_id`` that is
    not valid UTF-8 as ``bytes``; they become text here (Latin-1, which maps
    every byte), so nothing downstream meets a bytes name where it expects a
    string (a JSON key, a regex) and fails on every redelivery.
    """
    headers = properties.headers or {}
    if any(isinstance(name, bytes) for name in headers):
        headers = {_text(name): value for name, value in headers.items()}
    return AmqpMessage(
        body,
        headers,
        _optional_text(properties.content_type),
        _optional_text(properties.message_id),
        properties,
    )


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _optional_text(value: str | bytes | None) -> str | None:
    return None if value is None else _text(value)


@dataclass(frozen=True, slots=True)
class HttpRequestParts:
    headers: dict[str, str]
    body: bytes


# --------------------------------------------------------------------- AMQP -> Event


def from_amqp(message: AmqpMessage) -> Event:
    """Read a CloudEvent from an AMQP message.

    Raises ``NotACloudEvent`` when the message has no specversion in any form,
    and ``EventError`` (with a reason fit for a dead-letter) when it has one but
    is not a valid CloudEvent.
    """
    content_type = message.content_type or ""
    if content_type.lower().startswith("application/cloudevents"):
        return _from_structured(content_type, message.body)
    attributes = _binary_attributes(message.headers)
    if attributes is None:
        raise NotACloudEvent("no CloudEvents specversion in headers or content type")
    if message.content_type:
        attributes["datacontenttype"] = _clean("datacontenttype", message.content_type)
    return validated(attributes, message.body)


def _binary_attributes(headers: Mapping[str, Any]) -> dict[str, str] | None:
    lowered = {name.lower(): (name, value) for name, value in headers.items()}
    for prefix in _PREFIXES:
        if prefix + "specversion" in lowered:
            return {
                name[len(prefix) :]: _header_text(original, value)
                for name, (original, value) in lowered.items()
                if name.startswith(prefix) and value is not None
            }
    if "specversion" in lowered:
        # Bare form: every header that could be an attribute name is one (the
        # Knative ingress writes extensions bare as well); broker headers such
        # as x-death contain '-' and are not.
        return {
            name: _header_text(original, value)
            for name, (original, value) in lowered.items()
            if _ATTR_NAME.match(name) and value is not None
        }
    return None


def _header_text(name: str, value: Any) -> str:
    """Render an AMQP header value (any type pika decodes) as an attribute string."""
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


def _from_structured(content_type: str, body: bytes) -> Event:
    if not content_type.lower().startswith(STRUCTURED_CONTENT_TYPE):
        raise EventError(f"unsupported structured content type {content_type!r}")
    try:
        document = strict_json(body)
    except ValueError as e:
        raise EventError(f"structured event is not valid JSON: {e}") from e
    if not isinstance(document, dict):
        raise EventError("structured event is not a JSON object")
    return from_json_document(document, body)


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
        text = value if isinstance(value, str) else _header_text(name, value)
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
    if content_type is not None and not _header_safe_media_type(content_type):
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
    except BaseCloudEventException as e:  # not a ValueError: see FIELD-NOTES
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


def _header_safe_media_type(content_type: str) -> bool:
    # datacontenttype becomes the HTTP Content-Type header, which is ASCII.
    return content_type.isascii() and content_type.isprintable()


def _is_json(content_type: str | None) -> bool:
    if content_type is None:
        return True  # the JSON event format's default
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json") or media == "text/json"


def read(
    message: AmqpMessage, vhost: str, queue: str, non_cloudevent: str = "wrap"
) -> tuple[Event, str | None]:
    """The event a message carries, or a wrapped stand-in and why it cannot be delivered.

    One decision for every reader (the service, ``archive``): a message that is
    not a CloudEvent is wrapped (and, with ``non_cloudevent: dead_letter``,
    refused); a malformed one is wrapped and refused with the reason.
    """
    try:
        return from_amqp(message), None
    except NotACloudEvent:
        wrapped = wrap(message, vhost, queue)
        if non_cloudevent == "wrap":
            return wrapped, None
        return wrapped, "not a CloudEvent (non_cloudevent: dead_letter)"
    except EventError as e:
        return wrap(message, vhost, queue), f"malformed CloudEvent: {e.reason}"


# --------------------------------------------------------------------- wrapping


def wrap(message: AmqpMessage, vhost: str, queue: str) -> Event:
    """Wrap a message that is not a CloudEvent, with an id stable across redeliveries."""
    attributes = {
        "specversion": SPECVERSION,
        "id": message.message_id or stable_digest(message, queue),
        "source": f"rabbitmq://{quote(vhost, safe='')}/{quote(queue, safe='')}",
        "type": WRAPPED_TYPE,
    }
    if message.content_type and _header_safe_media_type(message.content_type):
        attributes["datacontenttype"] = message.content_type
    return Event(attributes, message.body)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why the properties of a message could not be read, and their bytes as received."""

    error: str
    properties: bytes


def wrap_unreadable(
    message: AmqpMessage, vhost: str, queue: str, unreadable: Unreadable
) -> tuple[Event, str]:
    """A message whose properties pika could not decode (``amqp_properties``): its
    body wrapped, and the reason it is dead-lettered. The id digests the property
    bytes as received as well as the body (``wrap``'s digest would see no
    properties at all), so two hostile messages with one body stay two events and
    a redelivery keeps its id. The service's dead letter and archive's line of the
    same message share both."""
    digest = hashlib.sha256()
    for part in (queue.encode(), unreadable.properties, message.body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    wrapped = wrap(message, vhost, queue)
    event = Event({**wrapped.attributes, "id": digest.hexdigest()}, wrapped.data)
    return event, f"unreadable AMQP properties: {unreadable.error}"


def stable_digest(message: AmqpMessage, queue: str) -> str:
    headers = {
        k: v for k, v in (message.headers or {}).items() if k.lower() not in _VOLATILE_HEADERS
    }
    properties = {
        name: value
        for name in _IDENTITY_PROPERTIES
        if (value := getattr(message.properties, name, None)) is not None
    }
    identity = {
        "queue": queue,
        "content_type": message.content_type,
        "properties": properties,
        "headers": headers,
    }
    try:
        try:
            described = json.dumps(identity, sort_keys=True, default=repr)
        except TypeError:  # a nested table with a bytes key: its repr is as stable
            described = repr(identity)
    except RecursionError:  # tables nested deeper than the interpreter's stack
        described = _flat_repr(identity)
    digest = hashlib.sha256()
    digest.update(described.encode("utf-8"))
    digest.update(b"\0")
    digest.update(message.body)
    return digest.hexdigest()


class _Rendered(str):
    """A piece of ``_flat_repr``'s output, told apart from a string value by its type."""


def _flat_repr(value: Any) -> str:
    """A stable description of nested tables and arrays of any depth, without recursion
    (json and repr recurse, and a hostile message can nest tables 10,000 deep)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if type(item) is _Rendered:
            out.append(item)
        elif isinstance(item, dict):
            out.append("{")
            stack.append(_Rendered("}"))
            for key, member in sorted(item.items(), key=lambda kv: repr(kv[0]), reverse=True):
                stack += [_Rendered(","), member, _Rendered(repr(key) + ":")]
        elif isinstance(item, list | tuple):
            out.append("[")
            stack.append(_Rendered("]"))
            for member in reversed(item):
                stack += [_Rendered(","), member]
        else:
            out.append(repr(item))
    return "".join(out)


# --------------------------------------------------------------------- Event -> HTTP


def to_http(event: Event, mode: str, trace: Mapping[str, str] | None = None) -> HttpRequestParts:
    """The request for a subscriber, in ``binary`` or ``structured`` content mode."""
    headers = dict(trace or {})
    if mode == "structured":
        headers["content-type"] = STRUCTURED_CONTENT_TYPE
        return HttpRequestParts(headers, to_json(event))
    for name, value in event.attributes.items():
        if name == "datacontenttype":
            headers["content-type"] = value
        else:
            quoted = quote(value, safe=_HTTP_SAFE) if _NEEDS_QUOTING.search(value) else value
            headers["ce-" + name] = quoted
    return HttpRequestParts(headers, event.data or b"")


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


def trace_headers(headers: Mapping[str, Any]) -> dict[str, str]:
    """W3C trace context from AMQP headers, passed through as HTTP headers.

    Only well-formed text values are passed: a trace header must never become
    a way to inject other HTTP headers.
    """
    found: dict[str, str] = {}
    for name, value in headers.items():
        lowered = name.lower()
        if lowered not in TRACE_HEADERS:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if isinstance(text, str) and text.isprintable() and text.isascii():
            found[lowered] = text
    return found


# --------------------------------------------------------------------- HTTP -> Event (replies)


def is_http_cloudevent(headers: Mapping[str, str]) -> bool:
    """Whether HTTP headers claim a CloudEvent (binary ``ce-specversion`` or structured type)."""
    for name, value in headers.items():
        lowered = name.lower()
        if lowered == "ce-specversion":
            return True
        if lowered == "content-type" and value.lower().startswith("application/cloudevents"):
            return True
    return False


def from_http_response(headers: Mapping[str, str], body: bytes) -> Event | None:
    """The CloudEvent in a subscriber's response, ``None`` when it holds none.

    Raises ``EventError`` when the response claims to be a CloudEvent (has
    ``ce-specversion`` or a structured content type) but is not a valid one.
    """
    if not is_http_cloudevent(headers):
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    content_type = lowered.get("content-type", "")
    if content_type.lower().startswith("application/cloudevents"):
        return _from_structured(content_type, body)
    attributes: dict[str, str] = {}
    for name, value in lowered.items():
        if name.startswith("ce-"):
            attributes[name[3:]] = _clean(name, unquote(value))
    if content_type:
        attributes["datacontenttype"] = content_type
    return validated(attributes, body)


# --------------------------------------------------------------------- Event -> AMQP


def to_amqp_headers(event: Event) -> tuple[dict[str, str], str | None]:
    """Binary ``ce-`` header form (the one this dispatcher reads) plus the content type."""
    headers = {"ce-" + k: v for k, v in event.attributes.items() if k != "datacontenttype"}
    return headers, event.attributes.get("datacontenttype")
