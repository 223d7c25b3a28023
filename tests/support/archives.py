"""Archives as ``dispatcher archive`` writes them, for the tests that replay one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dispatcher.event.cloudevent import Event
from dispatcher.pipeline import records


def plain_archive(folder: Path, count: int, prefix: str) -> None:
    """``count`` small events (ids ``<prefix>-<n>``, source ``/<prefix>``) in one
    day's one file under ``folder``: nothing to reject, filter or skip."""
    day = folder / "date=2026-11-20"
    day.mkdir(parents=True)
    archived = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    made = [
        Event(
            {"specversion": "1.0", "id": f"{prefix}-{i}", "source": f"/{prefix}", "type": "t"},
            b"{}",
        )
        for i in range(count)
    ]
    (day / "part-0.jsonl").write_bytes(b"\n".join(records.to_line(e, archived) for e in made))
