"""How a replay partition reads the copies of its events (``replay.Copies``), without
Spark: the rows are what the partition receives, one per (source, id)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from dispatcher.event.cloudevent import Event
from dispatcher.pipeline import records
from dispatcher.pipeline import replay_publish as replay
from dispatcher.pipeline.confirms import TURN

ARCHIVED_AT = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)


def row(*lines: bytes, deferred: bool = False) -> dict[str, Any]:
    copies = [
        {"file": "part-a.jsonl", "value": line.decode(), "deferred": deferred} for line in lines
    ]
    return {"copies": copies}


def good(n: int) -> bytes:
    attributes = {"specversion": "1.0", "id": f"e{n}", "source": "/s", "type": "t"}
    return records.to_line(Event(attributes, b"{}"), ARCHIVED_AT)


def test_a_long_run_of_copies_not_published_gives_the_loop_turns() -> None:
    bad = b'{"specversion":"1.0","id":"x","source":"/s","type":"t","data_base64":"***"}'
    rows = [row(good(0)), *(row(bad) for _ in range(1200)), row(good(1), good(1))]
    copies = replay.Copies(None, None, None)
    out = list(copies.outgoing(rows))
    assert [o is TURN for o in out] == [False, True, True, False]
    assert [o.key for o in out if o is not TURN] == [("/s", "e0"), ("/s", "e1")]
    assert (copies.rejected, copies.duplicates, copies.filtered_out) == (1200, 1, 0)


def test_a_copy_only_python_places_is_placed_in_the_window() -> None:
    inside, outside = (
        good(0),
        good(1).replace(b'"id":"e1"', b'"id":"e1","time":"2026-W30-1T00:00:00Z"'),
    )
    since = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    copies = replay.Copies(None, since, None)
    out = list(copies.outgoing([row(inside, deferred=True), row(outside, deferred=True)]))
    assert [o.key for o in out if o is not TURN] == [("/s", "e0")]
    assert copies.filtered_out == 1
