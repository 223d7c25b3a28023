"""The JSON event format (CloudEvents' ``json-format.md``), both ways.

Structured-mode bodies (an AMQP message's, an HTTP reply's) and archive lines
are read into an ``Event`` (``from_structured``, ``from_json_document``) and
written from one (``to_json``). JSON data keeps the exact bytes it came with:
numbers keep their precision and keys their order. ``strict_json`` is the
parser: no NaN or Infinity, and every failure a ValueError.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any, Final

from dispatcher.errors import EventError
from dispatcher.event.cloudevent import Event, attribute_text, checked_text, validated

STRUCTURED_CONTENT_TYPE: Final = "application/cloudevents+json"


def is_structured(content_type: str | None) -> bool:
    """A content type that says the body is a whole event (the structured mode, or
    a batch): every binding reads the mode by it, HTTP and AMQP alike."""
    return (content_type or "").lower().startswith("application/cloudevents")


# Attributes the JSON format requires to be strings (extensions may be numbers or booleans).
_STRING_ATTRIBUTES: Final = frozenset(
    {"specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"}
)


# --------------------------------------------------------------------- strict JSON


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


_STRICT_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite)
# ``to_json``'s layout, one encoder for every call (dumps builds one per call given options).
_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def strict_json(data: bytes | str) -> Any:
    """``json.loads`` that refuses NaN/Infinity and turns every failure into ValueError.

    A hostile document nested 100k deep raises RecursionError in the stdlib
    parser; it is bad input like any other.
    """
    try:
        # As json.loads reads it, with one decoder for every call (loads builds a
        # decoder and its scanner per call when given options: 2 us of from_line's 20).
        if isinstance(data, bytes | bytearray):
            data = data.decode(json.detect_encoding(data), "surrogatepass")
        elif data.startswith("\ufeff"):
            raise ValueError("Unexpected UTF-8 BOM (decode using utf-8-sig)")
        return _STRICT_DECODER.decode(data)
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
        attributes[name] = checked_text(name, text)
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
        raw = _spliced_data(document, text)
        if raw is None:
            raw = _raw_member(text, "data")
        if raw is not None:
            return raw.encode("utf-8")
    # Without the source text, JSON data can only be re-encoded from its value.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_JSON_WHITESPACE: Final = re.compile(r"[ \t\n\r]*")


def _spliced_data(document: dict[str, Any], text: str) -> str | None:
    """The source text of the data of a document laid out as ``to_json`` writes it
    (every other member compact and in order, then ``"data"`` spliced in last): the
    archive's lines, our own structured messages. None for any other layout, which
    ``_raw_member`` then scans member by member (a third of an archive line's parse)."""
    if ',"data":' not in text:  # another writer's spacing: no encoding spent on it
        return None
    members = {name: value for name, value in document.items() if name != "data"}
    if not members:
        return None
    head = _COMPACT.encode(members)[:-1] + ',"data":'
    if not text.startswith(head):
        return None
    scan: Callable[[str, int], tuple[Any, int]] = _STRICT_DECODER.scan_once  # type: ignore[attr-defined]
    try:
        _value, end = scan(text, len(head))
    except (StopIteration, ValueError, RecursionError):
        return None
    # The object must end right after it: no member after "data" (a repeated one wins).
    if text[end:].strip(" \t\n\r") != "}":
        return None
    return text[len(head) : end]


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
    # Compact JSON (ours, most writers') has no space between tokens: one
    # character test instead of a regular-expression call (an archive line's
    # from_line: 20.0 -> 16.1 us).
    if position < len(text) and text[position] not in " \t\n\r":
        return position
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
    encoded = _COMPACT.encode(document).encode("utf-8")
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
