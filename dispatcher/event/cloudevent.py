"""The CloudEvent as dispatcher forwards it, and its validation.

An ``Event`` keeps attributes as strings and data as the exact bytes received:
a dispatcher forwards events, so it must not re-serialise a subscriber's
payload or invent attributes. That is why the hot path does not build
``cloudevents.core.v1.event.CloudEvent`` objects for forwarding (its
constructor adds a fresh ``time`` when none is given and its JSON format
decodes and re-encodes data); the library is used where it adds value: as the
validator of required attributes and extension names.

Here too: the plain values that cross into and out of the core
(``AmqpMessage``, ``HttpRequestParts``, ``Unreadable``) and attribute text
(any header or JSON value as an attribute string; times written one way).

The CloudEvents specification's other parts each have a module:
``json_format`` (the JSON event format: structured mode, archive lines),
``amqp`` (the AMQP binding: where a message becomes a CloudEvent, and the ``ce-``
headers an event is published with) and ``http`` (the HTTP binding: an event as an
HTTP request, a reply as an event). None of them imports pika, pycurl or redis.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.v1.event import CloudEvent
from dateutil.parser import isoparse

from dispatcher.errors import EventError

SPECVERSION: Final = "1.0"

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")
# JSON can spell one (``\\ud800``); no CloudEvents string may hold it (the spec
# excludes surrogate code points) and no UTF-8 header or body can carry it.
_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")


# --------------------------------------------------------------------- values


# (source, id): what identifies an event, for duplicate suppression, requeue
# counts and verdicts.
Key = tuple[str, str]


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
    def key(self) -> Key:
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
    return checked_text(name, text)


def checked_text(name: str, text: str) -> str:
    """``text`` as attribute ``name``'s value: refused with control characters or
    a lone surrogate."""
    # isprintable() (C) says yes for almost every value; only a no needs the regexes.
    if not text.isprintable():
        if _CONTROL.search(text):
            raise EventError(f"header {name!r} contains control characters (CR, LF or other)")
        if _SURROGATE.search(text):
            raise EventError(
                f"attribute {name!r} contains a lone surrogate (U+D800 to U+DFFF), "
                "which no CloudEvents string may hold"
            )
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
