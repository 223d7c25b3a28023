"""The archive's file writer and message-to-line step (no broker needed)."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
import re
import stat
from pathlib import Path

import pytest

from dispatcher.errors import BatchFailed, BatchInputError
from dispatcher.event import amqp as amqp_binding
from dispatcher.event import cloudevent as events
from dispatcher.event.cloudevent import AmqpMessage
from dispatcher.pipeline import archive, archive_files, records
from dispatcher.pipeline.archive_files import write_batch

NOW = dt.datetime(2026, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
PART = re.compile(r"^part-20260506T070809Z-[0-9a-f]{12}\.jsonl$")


def everything(out: Path) -> list[str]:
    """Every file below ``out`` (hidden ones too), relative, sorted."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())


def test_a_batch_is_one_file_per_date_folder_with_exactly_its_lines(tmp_path):
    lines = {"2026-01-02": [b'{"a":1}', b'{"a":2}'], "2026-03-04": [b'{"b":1}']}

    written = write_batch(tmp_path, lines, NOW)

    assert [p.parent.name for p in written] == ["date=2026-01-02", "date=2026-03-04"]
    for path, date in zip(written, lines, strict=True):
        assert PART.match(path.name), path.name
        assert path.read_bytes() == b"".join(line + b"\n" for line in lines[date])
    assert everything(tmp_path) == sorted(str(p.relative_to(tmp_path)) for p in written)


def test_part_names_are_unique_and_sort_by_time():
    names = {archive_files.part_name(NOW) for _ in range(1000)}
    assert len(names) == 1000
    later = archive_files.part_name(NOW + dt.timedelta(seconds=1))
    assert max(names) < later
    # Written as a hidden name that no reader matches (*.jsonl, non-hidden).
    temp = archive_files.temp_name(later)
    assert temp.startswith(".") and not temp.endswith(".jsonl")


def test_data_is_fsynced_under_a_hidden_name_then_renamed_then_the_folder_fsynced(
    tmp_path, monkeypatch
):
    steps: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        steps.append(f"fsync {kind}")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        src, dst = Path(src), Path(dst)
        assert src.exists() and not dst.exists()
        assert src.read_bytes() == b"x\n"  # complete before it becomes visible
        steps.append(f"rename {src.name} -> {dst.name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    (written,) = write_batch(tmp_path, {"2026-01-02": [b"x"]}, NOW)

    assert steps == [
        "fsync dir",  # the new date= folder's entry in OUT
        "fsync file",
        f"rename .{written.name}.tmp -> {written.name}",
        "fsync dir",  # the rename itself
    ]


def test_an_existing_folder_is_reused_without_fsyncing_its_parent(tmp_path, monkeypatch):
    write_batch(tmp_path, {"2026-01-02": [b"x"]}, NOW)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    write_batch(tmp_path, {"2026-01-02": [b"y"]}, NOW)

    assert len(synced) == 2  # the file and its folder
    assert len(list((tmp_path / "date=2026-01-02").iterdir())) == 2


def test_a_failed_write_leaves_no_temporary_file_and_raises(tmp_path, monkeypatch):
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    write_batch(tmp_path, {"2026-01-02": [b"before"]}, NOW)  # folder exists: only the file fails
    before = everything(tmp_path)
    monkeypatch.setattr(os, "fsync", full)

    with pytest.raises(BatchFailed, match="No space left on device"):  # exit code 1
        write_batch(tmp_path, {"2026-01-02": [b"x"]}, NOW)

    assert everything(tmp_path) == before


def test_a_batch_is_all_or_nothing_across_folders(tmp_path):
    # The second folder cannot be created (a file is in the way), after the
    # first file was already renamed into place: that one must go again, since
    # none of the batch will be acked and all of it will be archived again.
    blocker = tmp_path / "date=2026-03-04"
    blocker.write_bytes(b"not a folder")
    lines = {"2026-01-02": [b"a"], "2026-03-04": [b"b"]}

    with pytest.raises(BatchFailed, match=r"date=2026-03-04"):
        write_batch(tmp_path, lines, NOW)

    assert everything(tmp_path) == ["date=2026-03-04"]
    assert list((tmp_path / "date=2026-01-02").iterdir()) == []


def test_prepare_out_creates_missing_parents_and_refuses_a_file(tmp_path):
    out = tmp_path / "a" / "b"
    archive_files.prepare_out(out)
    assert out.is_dir()

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BatchInputError, match="cannot create the folder"):  # exit code 2
        archive_files.prepare_out(blocker)


# --------------------------------------------------------------------- message -> line

ARCHIVED_AT = dt.datetime(2026, 7, 8, 9, 10, 11, tzinfo=dt.UTC)


def record(message: AmqpMessage) -> tuple[str, events.Event, bytes]:
    date, line = archive.to_record(message, "/", "dlq", ARCHIVED_AT)
    return date, records.from_line(line), line


def test_a_pretty_printed_json_payload_still_makes_one_line_with_the_exact_data():
    body = b'{\r\n  "a": [1,\n 2],\n  "s": "x\\ny"\n}\n'
    headers = {"ce-specversion": "1.0", "ce-id": "p", "ce-source": "/s", "ce-type": "t"}

    date, event, line = record(AmqpMessage(body, headers, "application/json"))

    assert b"\n" not in line and b"\r" not in line
    assert event.data == body
    assert dict(event.attributes) == {
        **{name[3:]: value for name, value in headers.items()},
        "datacontenttype": "application/json",
        records.ARCHIVED: "2026-07-08T09:10:11Z",
    }
    assert date == "2026-07-08"  # no time attribute: the day it was archived


def test_compact_json_data_stays_readable_json_in_the_line():
    headers = {"ce-specversion": "1.0", "ce-id": "p", "ce-source": "/s", "ce-type": "t"}
    _, _, line = record(AmqpMessage(b'{"a": 1}', headers, "application/json"))
    assert json.loads(line)["data"] == {"a": 1}


def test_a_malformed_cloudevent_is_wrapped_with_a_printable_bounded_reason():
    headers = {"ce-specversion": "9" * 2000, "ce-id": "x", "ce-source": "/s", "ce-type": "t"}
    message = AmqpMessage(b"body", headers, "text/plain", "msg-1")

    _, event, _ = record(message)

    reason = event.attributes["dispatchererror"]
    assert reason.startswith("malformed CloudEvent: unsupported specversion '999")
    assert len(reason) == 512 and reason.isprintable()
    assert event.id == "msg-1" and event.type == amqp_binding.WRAPPED_TYPE
    assert event.source == "rabbitmq://%2F/dlq" and event.data == b"body"


def test_a_non_cloudevent_is_wrapped_with_the_services_stable_id():
    message = AmqpMessage(b"\xff\x00raw", {"x-death": [{"count": 1}]}, None)

    _, event, _ = record(message)

    assert event.id == amqp_binding.stable_digest(message, "dlq")
    assert "dispatchererror" not in event.attributes
    assert event.data == b"\xff\x00raw"


def test_an_internal_error_while_reading_still_archives_the_message(monkeypatch):
    def boom(message: AmqpMessage) -> events.Event:
        raise RuntimeError("boom")

    monkeypatch.setattr(amqp_binding, "from_amqp", boom)

    _, event, _ = record(AmqpMessage(b"body", {}, "text/plain", "m"))

    assert event.attributes["dispatchererror"] == "internal error: RuntimeError: boom"
    assert event.data == b"body"


def test_the_time_attribute_decides_the_folder_in_utc():
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "t",
        "ce-source": "/s",
        "ce-type": "t",
        "ce-time": "2026-03-04T23:30:00-02:00",
    }
    date, event, _ = record(AmqpMessage(b"{}", headers, "application/json"))
    assert date == "2026-03-05"
    assert event.attributes[records.ARCHIVED] == "2026-07-08T09:10:11Z"


@pytest.mark.parametrize(
    ("time", "date", "instant"),
    [
        (
            "9999-12-31T23:59:59-01:00",
            "9999-12-31",
            dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(-dt.timedelta(hours=1))),
        ),
        (
            "0001-01-01T00:00:00+01:00",
            "0001-01-01",
            dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        ),
        (
            "2026-11-20T23:30:00-01:00",
            "2026-11-21",
            dt.datetime(2026, 11, 21, 0, 30, tzinfo=dt.UTC),
        ),
    ],
)
def test_a_time_at_the_edge_of_the_calendar_is_placed_not_a_crash(time, date, instant):
    """A valid ``time`` whose offset takes it outside years 1-9999 raised OverflowError
    in the conversion to UTC: ``archive`` crashed on it every run, its batch unacked,
    and ``replay`` lost its whole job. Its folder is the calendar's first or last
    day; the time filters compare its true instant."""
    event = events.validated(
        {"specversion": "1.0", "id": "e", "source": "/s", "type": "t", "time": time}, b""
    )
    again = records.from_line(records.line(event))
    assert records.instant(again) == instant
    assert records.partition_date(again, NOW) == date
