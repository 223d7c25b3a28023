"""CloudEvents' AMQP protocol binding: where a message becomes a CloudEvent
(read, wrapped, or a stand-in), and the ``ce-`` headers an event is published with.

Accepted AMQP forms (first match wins):

- binary, attributes in headers named ``ce-<attr>``, ``cloudEvents_<attr>``,
  ``cloudEvents:<attr>`` or bare ``<attr>`` (as the Knative ingress writes);
  the ``content_type`` property is ``datacontenttype``, the body is the data;
- structured, ``content_type`` starting with ``application/cloudevents``
  (JSON event format);
- anything else is not a CloudEvent: ``NotACloudEvent``.

``read`` is the one decision every reader (the service, ``archive``) makes
from there: a message that is not a CloudEvent is wrapped in one, with an id
that stays the same across redeliveries (``stable_digest``); a malformed one
is wrapped too, with the reason it cannot be delivered. A message whose
properties pika could not decode gets a stand-in of its own
(``wrap_unreadable``).

pika-independent: pika's properties object is read through its attributes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from dispatcher.config import NonCloudEvent
from dispatcher.errors import EventError, NotACloudEvent
from dispatcher.event.cloudevent import (
    SPECVERSION,
    AmqpMessage,
    Event,
    Unreadable,
    attribute_text,
    header_safe_media_type,
    validated,
)
from dispatcher.event.json_format import from_structured, is_structured

WRAPPED_TYPE: Final = "dev.dispatcher.rabbitmq.message"

# Header prefixes of the binary forms, lower-cased; the bare form has none.
_PREFIXES: Final = ("ce-", "cloudevents_", "cloudevents:")
_ATTR_NAME: Final = re.compile(r"^[a-z0-9]{1,64}$")
# The bare form is the Knative broker ingress's layout. It writes its span's W3C
# context as bare ``traceparent``/``tracestate`` headers: trace context, passed
# on as such (``event.http.trace_headers``), never an event attribute, as
# Knative's own dispatcher reads them. And it writes ``time`` for an event that
# had none as Go's zero instant, which Knative's SDK reads back as no time.
_BARE_TRACE_CONTEXT: Final = frozenset({"traceparent", "tracestate"})
_GO_ZERO_TIME: Final = "0001-01-01T00:00:00Z"
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


# --------------------------------------------------------------------- as received


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


# --------------------------------------------------------------------- AMQP -> Event


def read(
    message: AmqpMessage, vhost: str, queue: str, non_cloudevent: NonCloudEvent = "wrap"
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


def from_amqp(message: AmqpMessage) -> Event:
    """Read a CloudEvent from an AMQP message.

    Raises ``NotACloudEvent`` when the message has no specversion in any form,
    and ``EventError`` (with a reason fit for a dead-letter) when it has one but
    is not a valid CloudEvent.
    """
    if is_structured(message.content_type):
        return from_structured(message.content_type or "", message.body)
    attributes = _binary_attributes(message.headers)
    if attributes is None:
        raise NotACloudEvent("no CloudEvents specversion in headers or content type")
    if message.content_type:
        attributes["datacontenttype"] = attribute_text("datacontenttype", message.content_type)
    return validated(attributes, message.body)


def _binary_attributes(headers: Mapping[str, Any]) -> dict[str, str] | None:
    lowered = {name.lower(): (name, value) for name, value in headers.items()}
    for prefix in _PREFIXES:
        if prefix + "specversion" in lowered:
            return {
                name[len(prefix) :]: attribute_text(original, value)
                for name, (original, value) in lowered.items()
                if name.startswith(prefix) and value is not None
            }
    if "specversion" in lowered:
        # Bare form: every header that could be an attribute name is one (the
        # Knative ingress writes extensions bare as well); broker headers such
        # as x-death contain '-' and are not.
        attributes = {
            name: attribute_text(original, value)
            for name, (original, value) in lowered.items()
            if _ATTR_NAME.match(name) and value is not None and name not in _BARE_TRACE_CONTEXT
        }
        if attributes.get("time") == _GO_ZERO_TIME:
            del attributes["time"]
        return attributes
    return None


# --------------------------------------------------------------------- wrapping


def wrap(message: AmqpMessage, vhost: str, queue: str) -> Event:
    """Wrap a message that is not a CloudEvent, with an id stable across redeliveries."""
    attributes = {
        "specversion": SPECVERSION,
        "id": message.message_id or stable_digest(message, queue),
        "source": f"rabbitmq://{quote(vhost, safe='')}/{quote(queue, safe='')}",
        "type": WRAPPED_TYPE,
    }
    if message.content_type and header_safe_media_type(message.content_type):
        attributes["datacontenttype"] = message.content_type
    return Event(attributes, message.body)


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


# --------------------------------------------------------------------- Event -> AMQP


def to_amqp_headers(event: Event) -> tuple[dict[str, str], str | None]:
    """Binary ``ce-`` header form (the one ``from_amqp`` reads first) plus the content
    type: how the publisher and ``replay`` put an event on an exchange."""
    headers = {"ce-" + k: v for k, v in event.attributes.items() if k != "datacontenttype"}
    return headers, event.attributes.get("datacontenttype")
