"""The archive format: one structured CloudEvent (JSON) per line, by date.

``archive`` writes ``OUT/date=YYYY-MM-DD/part-….jsonl``; ``replay`` reads every
``*.jsonl`` and ``*.jsonl.gz`` below a folder. Each line is the event in the
JSON event format (data spliced in byte for byte, see ``json_format.to_json``) plus
one extension, ``dispatcherarchived``: the instant the archiver received it.
The instant of an event, which decides its date folder and the replay's
``--since``/``--until``, is its ``time`` attribute, else ``dispatcherarchived``:
an event without ``time`` still belongs to the day it was archived. Replay
removes ``dispatcherarchived`` again before it publishes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Final

from dateutil.parser import isoparse

from dispatcher.errors import EventError
from dispatcher.event import cloudevent, json_format
from dispatcher.event.cloudevent import Event

ARCHIVED: Final = "dispatcherarchived"


def to_line(event: Event, archived_at: dt.datetime) -> bytes:
    """The archive line for ``event``, received at ``archived_at`` (no newline)."""
    return line(event.with_extensions({ARCHIVED: cloudevent.format_time(archived_at)}))


def line(event: Event) -> bytes:
    """``event`` as one archive line (no newline), its attributes as they are."""
    text = json_format.to_json(event)
    if b"\n" not in text and b"\r" not in text:
        return text
    # ``json_format.to_json`` splices JSON data in byte for byte, so a pretty-printed
    # payload brings its line breaks along and would split the record (attribute
    # values cannot: JSON escapes them). Such data goes as ``data_base64``,
    # which the JSON event format allows for any data: one line, exact bytes.
    document = {**event.attributes, "data_base64": base64.b64encode(event.data or b"").decode()}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def from_line(line: str | bytes) -> Event:
    """Parse and validate one archive line; ``EventError`` says what is wrong with it."""
    try:
        document = json_format.strict_json(line)
    except ValueError as e:
        raise EventError(f"not JSON: {e}") from e
    if not isinstance(document, dict):
        raise EventError("not a JSON object")
    return json_format.from_json_document(document, line)


def instant(event: Event) -> dt.datetime | None:
    """When the event happened (``time``), else when it was archived; aware, in UTC
    where Python's datetime can hold it there (``_in_utc``)."""
    for name in ("time", ARCHIVED):
        text = event.attributes.get(name)
        if text is None:
            continue
        try:
            value = isoparse(text)
        except (ValueError, OverflowError):
            continue  # from_line validated ``time``; a broken ARCHIVED falls through
        if value.tzinfo is not None:
            return _in_utc(value)
    return None


_EARLIEST: Final = dt.datetime.min.replace(tzinfo=dt.UTC)
_LATEST: Final = dt.datetime.max.replace(tzinfo=dt.UTC)


def _in_utc(value: dt.datetime) -> dt.datetime:
    """``value`` in UTC; as it is when its offset takes it outside years 1-9999 in
    UTC (``9999-12-31T23:59:59-01:00``): still aware, still the same instant for
    every comparison and difference. ``astimezone`` raised OverflowError on it:
    ``archive`` crashed on it every run with its batch unacked, ``replay`` lost
    the whole job."""
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        return value


def partition_date(event: Event, archived_at: dt.datetime) -> str:
    """``YYYY-MM-DD`` (UTC) of the folder the event is archived in."""
    when = instant(event) or archived_at.astimezone(dt.UTC)
    if when.utcoffset():  # outside what Python holds in UTC: the calendar's edge
        when = _LATEST if when.year == dt.MAXYEAR else _EARLIEST
    return when.date().isoformat()


def for_replay(event: Event) -> Event:
    """The event as it was before it was archived."""
    if ARCHIVED not in event.attributes:
        return event
    return Event({k: v for k, v in event.attributes.items() if k != ARCHIVED}, event.data)
