"""CloudEvents' HTTP protocol binding: an event as an HTTP request, and a
subscriber's HTTP reply as an event.

The request is built as plain parts (``HttpRequestParts``: headers and body);
sending them is ``dispatcher/http/``'s job (libcurl), which this module never
imports. Binary content mode writes attributes as ``ce-`` headers, quoted as
the CloudEvents HTTP binding says; structured mode sends the JSON event format
(``json_format.to_json``). W3C trace context read from the message's AMQP headers
rides along, checked so that it can never inject another header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote, unquote_to_bytes

from dispatcher.config import ContentMode
from dispatcher.event.cloudevent import Event, HttpRequestParts, attribute_text, validated
from dispatcher.event.json_format import (
    STRUCTURED_CONTENT_TYPE,
    from_structured,
    is_structured,
    to_json,
)

TRACE_HEADERS: Final = ("traceparent", "tracestate")
# Sent with every request to a subscriber (not to a sink or reply URL): the
# Knative data plane's way of saying that a reply event in the answer is read.
SUBSCRIBER_HEADERS: Final = (("Prefer", "reply"),)

# The CloudEvents HTTP binding (3.1.3.2): printable ASCII except space, '"' and '%'.
_HTTP_SAFE: Final = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ' "%')
_NEEDS_QUOTING: Final = re.compile("[^" + re.escape(_HTTP_SAFE) + "]")


# --------------------------------------------------------------------- Event -> HTTP


def to_http(
    event: Event, mode: ContentMode, trace: Mapping[str, str] | None = None
) -> HttpRequestParts:
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
        if lowered == "content-type" and is_structured(value):
            return True
    return False


def from_http_response(headers: Mapping[str, str], body: bytes) -> Event | None:
    """The CloudEvent in a subscriber's response, ``None`` when it holds none.

    Raises ``EventError`` when the response claims to be a CloudEvent (has
    ``ce-specversion`` or a structured content type) but is not a valid one.
    ``headers``: as ``seams.parse_head`` reads them, each value its bytes as Latin-1.
    """
    if not is_http_cloudevent(headers):
        return None
    lowered = {k.lower(): v for k, v in headers.items()}
    content_type = lowered.get("content-type", "")
    if is_structured(content_type):
        return from_structured(content_type, body)
    attributes: dict[str, str] = {}
    for name, value in lowered.items():
        if name.startswith("ce-"):
            # The spec's encoding: UTF-8, percent-encoded where not printable ASCII.
            # Header lines arrive as bytes read as Latin-1 (``seams.parse_head``):
            # back to those bytes, percent-decoded, then strictly UTF-8, so neither
            # raw UTF-8 nor an escape of a byte that is no UTF-8 is misread.
            attributes[name[3:]] = attribute_text(name, unquote_to_bytes(value.encode("latin-1")))
    if content_type:
        attributes["datacontenttype"] = content_type
    return validated(attributes, body)
