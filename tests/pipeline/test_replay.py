"""``dispatcher replay`` against the real broker: exactly the selected events, once each,
persistent, in the form the service reads, on one connection per partition."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from dispatcher import cli
from dispatcher.event import amqp as amqp_binding
from dispatcher.event import cloudevent as events
from dispatcher.event.cloudevent import AmqpMessage, Event
from dispatcher.pipeline import records
from tests.support import broker
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.spark, pytest.mark.broker]

ARCHIVED_AT = dt.datetime(2026, 11, 20, 23, 30, tzinfo=dt.UTC)
TYPES = ("com.example.created", "com.example.paid")
SOURCES = ("/orders", "/billing")
JUNK = [b"not json", b'{"specversion": "1.0", "id": "x"}', b"[1, 2]", b'{"truncated": ']


def instant_of(event: Event) -> dt.datetime:
    """Where replay places the event in time: its ``time``, else when it was archived."""
    return records.instant(event) or ARCHIVED_AT


def make_events(count: int) -> list[Event]:
    made = []
    for i in range(count):
        attributes = {
            "specversion": "1.0",
            "id": f"ev-{i}",
            "source": SOURCES[i % 2],
            "type": TYPES[(i // 2) % 2],
            "datacontenttype": "application/json",
            "traceparent": f"00-{i:032x}-{i:016x}-01",
        }
        if i % 5:  # every fifth event has no time: its archive time places it
            when = dt.datetime(2026, 11, 20, tzinfo=dt.UTC) + dt.timedelta(minutes=7 * i)
            attributes["time"] = events.format_time(when)
        made.append(Event(attributes, b'{"n": %d, "text": "caf\xc3\xa9"}' % i))
    return made


def write_archive(folder: Path, made: list[Event]) -> None:
    """Three files (one gzip), the first 30 events archived twice, junk and a hidden temp file."""
    lines = [records.to_line(e, ARCHIVED_AT) for e in made]
    third = len(lines) // 3
    day = folder / "date=2026-11-20"
    day.mkdir(parents=True)
    (day / "part-a.jsonl").write_bytes(b"\n".join([*lines[:third], *JUNK[:2]]) + b"\n")
    with gzip.open(day / "part-b.jsonl.gz", "wb") as stream:
        stream.write(b"\n".join([*lines[third : 2 * third], *JUNK[2:]]) + b"\n")
    other = folder / "date=2026-11-21"
    other.mkdir()
    (other / "part-c.jsonl").write_bytes(b"\n".join([*lines[2 * third :], *lines[:30]]) + b"\n")
    (other / ".part-d.jsonl.tmp").write_bytes(lines[0] + b"\n")  # an interrupted archiver's
    (other / "notes.txt").write_text("not an archive file\n")


@pytest.fixture
def target() -> Iterator[tuple[str, str]]:
    """(exchange, queue): a direct exchange routing 'replayed' to a fresh queue."""
    exchange, queue = broker.unique("replay-x"), broker.unique("replay-q")
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "direct")
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, routing_key="replayed")
    yield exchange, queue
    with broker.channel() as ch:
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)


def received(queue: str) -> list[tuple[Event, Any]]:
    """Every message in the queue read back as the service reads it, with its properties."""
    return [
        (amqp_binding.from_amqp(AmqpMessage(body, p.headers or {}, p.content_type)), p)
        for p, body in broker.get_all(queue)
    ]


def rejects_in(out: Path) -> list[dict[str, str]]:
    """Every reject in ``out/rejects``: Spark's part files and the partitions' own."""
    return [
        json.loads(line)
        for path in sorted((out / "rejects").glob("*.json"))
        for line in path.read_text().splitlines()
    ]


def run_replay(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = cli.main(["replay", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def replay_folder(tmp_path: Path, exchange: str, capsys: Any) -> tuple[int, str, str]:
    """``tmp_path/archive`` to ``exchange`` (routing key ``replayed``), out in ``tmp_path/out``."""
    return run_replay(
        ["--archive", str(tmp_path / "archive"), "--exchange", exchange,
         "--routing-key", "replayed", "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip


def test_replays_every_event_once_in_the_form_the_service_reads(
    spark: Any,
    target: tuple[str, str],
    tmp_path: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exchange, queue = target
    made = make_events(300)
    write_archive(tmp_path / "archive", made)
    proxy = FaultProxy(5672)  # counts the connections replay opens
    monkeypatch.setenv("RABBITMQ_URL", proxy.url)
    try:
        code, out, err = run_replay(
            ["--archive", str(tmp_path / "archive"), "--exchange", exchange,
             "--routing-key", "replayed", "--partitions", "3", "--out", str(tmp_path / "out")],
            capsys,
        )  # fmt: skip
    finally:
        proxy.close()
    assert code == 0, err
    got = received(queue)
    by_key = {e.key: e for e in made}
    assert sorted(e.key for e, _ in got) == sorted(by_key)  # exactly once each
    for event, properties in got:
        assert properties.delivery_mode == 2
        assert event == by_key[event.key]  # attributes and data bytes, archive marker gone
        assert records.ARCHIVED not in event.attributes
    # One long-lived connection per partition, plus the driver's exchange check.
    assert proxy.accepted <= 3 + 1
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert counts["published"] == 300
    assert counts["skipped_duplicate"] == 30
    assert counts["malformed"] == len(JUNK)
    assert counts["filtered_out"] == 0
    assert counts["failed"] == 0
    assert counts["partitions"] == 3 and counts["connections"] == 3
    assert "published 300, skipped 30 as duplicate" in out
    rejects = rejects_in(tmp_path / "out")
    assert sorted(r["line"].encode() for r in rejects) == sorted(JUNK)
    assert all(r["reason"] and r["file"].endswith((".jsonl", ".jsonl.gz")) for r in rejects)


def test_a_json_event_the_service_would_refuse_is_a_reject_with_the_services_reason(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    # JSON objects with every required attribute, read as the service reads an
    # event: a bad time, bad base64, a bad extension name. Never published.
    exchange, queue = target
    made = make_events(10)
    good = [records.to_line(e, ARCHIVED_AT) for e in made]
    invalid = [
        b'{"specversion":"1.0","id":"t","source":"/s","type":"t","time":"yesterday"}',
        b'{"specversion":"1.0","id":"b","source":"/s","type":"t","data_base64":"***"}',
        b'{"specversion":"1.0","id":"x","source":"/s","type":"t","bad-name":"1"}',
    ]
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    (day / "part-a.jsonl").write_bytes(b"\n".join([*good, good[0], *invalid, JUNK[0]]) + b"\n")
    code, _out, err = replay_folder(tmp_path, exchange, capsys)
    assert code == 0, err
    assert sorted(e.key for e, _ in received(queue)) == sorted(e.key for e in made)
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert (counts["lines"], counts["published"], counts["skipped_duplicate"]) == (15, 10, 1)
    assert counts["malformed"] == len(invalid) + 1
    rejects = {r["line"]: r["reason"] for r in rejects_in(tmp_path / "out")}
    assert rejects.keys() == {line.decode() for line in [*invalid, JUNK[0]]}
    assert "RFC 3339" in rejects[invalid[0].decode()]
    assert "base64" in rejects[invalid[1].decode()]
    assert rejects[JUNK[0].decode()].startswith("not JSON")


def test_filters_select_by_type_source_and_time_range(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    exchange, queue = target
    made = make_events(200)
    write_archive(tmp_path / "archive", made)
    since = dt.datetime(2026, 11, 20, 0, 14, tzinfo=dt.UTC)  # event 2 exactly
    until = dt.datetime(2026, 11, 20, 23, 30, tzinfo=dt.UTC)  # = the archive time: excluded
    wanted = {
        e.key
        for e in made
        if e.type == TYPES[1] and e.source == SOURCES[0] and since <= instant_of(e) < until
    }
    # The boundaries matter: an event exactly at --since is in, one at --until is out.
    assert any(instant_of(e) == since for e in made if e.key in wanted)
    assert any(instant_of(e) == until for e in made if e.type == TYPES[1])

    code, _out, err = run_replay(
        ["--archive", str(tmp_path / "archive"), "--exchange", exchange,
         "--routing-key", "replayed", "--type", TYPES[1], "--source", SOURCES[0],
         "--since", since.isoformat(), "--until", "2026-11-20T23:30:00Z",
         "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip

    assert code == 0, err
    assert sorted(e.key for e, _ in received(queue)) == sorted(wanted)
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert counts["published"] == len(wanted)
    valid_lines = 200 + 30
    assert counts["filtered_out"] + counts["skipped_duplicate"] + len(wanted) == valid_lines


def test_unroutable_events_fail_exit_1_and_are_saved_for_a_retry(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    exchange, queue = target
    pretty = Event(
        {"specversion": "1.0", "id": "pretty", "source": "/orders", "type": TYPES[0]},
        b'{\n  "pretty": true\n}',  # line breaks in the data: archived as data_base64
    )
    made = [*make_events(40), pretty]
    write_archive(tmp_path / "archive", made)
    window = ["--since", "2026-11-20", "--until", "2026-11-22"]  # both runs, same filter
    code, out, _err = run_replay(
        ["--archive", str(tmp_path / "archive"), "--exchange", exchange,
         "--routing-key", "bound-to-nothing", *window, "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert code == 1
    assert "41 failed" in out and "unroutable" in out
    assert received(queue) == []
    # failed/ is an archive of exactly those events, in time as the originals
    # (those without `time` keep their archive time): the same replay retries them.
    code, out, _err = run_replay(
        ["--archive", str(tmp_path / "out" / "failed"), "--exchange", exchange,
         "--routing-key", "replayed", *window, "--out", str(tmp_path / "retry")],
        capsys,
    )  # fmt: skip
    assert code == 0, out
    got = {e.key: e for e, _ in received(queue)}
    assert sorted(got) == sorted(e.key for e in made)
    assert got[pretty.key].data == pretty.data
    # A run may not read the failed/ folder it is about to replace.
    code, _out, err = run_replay(
        ["--archive", str(tmp_path / "out" / "failed"), "--exchange", exchange,
         "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert code == 2 and "use another --out" in err


def test_a_missing_exchange_is_exit_2_and_nothing_is_declared(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    write_archive(tmp_path / "archive", make_events(10))
    missing = broker.unique("no-such-exchange")
    code, _out, err = run_replay(
        ["--archive", str(tmp_path / "archive"), "--exchange", missing], capsys
    )
    assert code == 2
    assert f"--exchange {missing}: 404" in err
    with broker.channel() as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.exchange_declare(missing, passive=True)


def test_bad_arguments_are_exit_2(spark: Any, tmp_path: Path, capsys: Any) -> None:
    code, _out, err = run_replay(["--archive", str(tmp_path / "nope"), "--exchange", ""], capsys)
    # One line, with the prefix of every command's errors.
    assert code == 2 and err == f"dispatcher: --archive {tmp_path / 'nope'}: not a folder\n"
    code, _out, err = run_replay(
        ["--archive", str(tmp_path), "--exchange", "", "--since", "2026-11-21",
         "--until", "2026-11-20"],
        capsys,
    )  # fmt: skip
    assert code == 2 and "--since must be before --until" in err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["replay", "--archive", str(tmp_path), "--exchange", "", "--since", "yesterday"])
    assert exit_info.value.code == 2
    assert "not an ISO-8601" in capsys.readouterr().err


def test_an_archive_with_no_files_publishes_nothing(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    exchange, queue = target
    (tmp_path / "archive" / "date=2026-11-20").mkdir(parents=True)
    (tmp_path / "archive" / "date=2026-11-20" / ".part-x.jsonl.tmp").write_text("{}\n")
    code, out, err = replay_folder(tmp_path, exchange, capsys)
    assert code == 0, err
    assert "published 0," in out and "of 0 lines" in out
    assert received(queue) == []


def test_a_broken_gzip_file_is_exit_2_naming_it_and_nothing_is_published(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    exchange, queue = target
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    (day / "part-a.jsonl").write_bytes(records.to_line(make_events(1)[0], ARCHIVED_AT) + b"\n")
    (day / "part-b.jsonl.gz").write_bytes(b"a copy that is not gzip\n")
    code, _out, err = replay_folder(tmp_path, exchange, capsys)
    assert code == 2
    assert f"--archive: cannot read {day / 'part-b.jsonl.gz'} (Not a gzipped file" in err
    assert received(queue) == []


def test_a_corrupt_copy_of_a_duplicated_event_never_stands_in_for_it(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    # The copies of an event meet in one partition, in file order: the corrupt
    # copy (same source and id, data the service refuses) comes first.
    exchange, queue = target
    event = make_events(1)[0]
    good = records.to_line(event, ARCHIVED_AT)
    corrupt = json.dumps({**event.attributes, "data_base64": "***"}).encode()
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    (day / "part-a.jsonl").write_bytes(corrupt + b"\n")
    (day / "part-b.jsonl").write_bytes(good + b"\n" + good + b"\n")
    code, _out, err = replay_folder(tmp_path, exchange, capsys)
    assert code == 0, err
    got = received(queue)
    assert [e for e, _ in got] == [event]
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert (counts["published"], counts["skipped_duplicate"], counts["malformed"]) == (1, 1, 1)
    rejects = rejects_in(tmp_path / "out")
    assert [(r["line"], r["file"].endswith("part-a.jsonl")) for r in rejects] == [
        (corrupt.decode(), True)
    ]
    assert "base64" in rejects[0]["reason"]


# Times the service accepts (dateutil's isoparse, with an offset) in forms Spark's
# timestamp reader does not read the same way, and the RFC 3339 forms it does.
TIME_FORMS = [
    "2026-11-20T11:00:00Z",
    "2026-11-20t12:00:00.123456789z",  # lower case, nanoseconds
    "2026-11-20T13:00:00+01:00",
    "2026-11-20T14:00:00+0100",  # basic offset
    "2026-11-20T15:00:00+01",
    "2026-11-20T12:00Z",  # no seconds
    "20261120T150000Z",  # basic format
    "2026-W47-5T16:00:00Z",  # week date: 2026-11-20
    "2026-11-20T17:00:00+23:59",  # beyond Spark's 18-hour offsets: 2026-11-19T17:01
    "2026-11-19T24:00:00Z",  # = 2026-11-20T00:00
    "2026-11-20T09:59:59.999999Z",
    "2026-11-20T18:00:00-06:00",  # 2026-11-21T00:00: --until, out
]


def test_the_time_window_places_every_time_form_the_service_accepts(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    exchange, queue = target
    made = []
    for i, form in enumerate(TIME_FORMS):
        attributes = {"specversion": "1.0", "id": f"t-{i}", "source": "/s", "type": "t"}
        made.append(Event({**attributes, "time": form}, b"{}"))
    since = dt.datetime(2026, 11, 20, 0, 0, tzinfo=dt.UTC)
    until = dt.datetime(2026, 11, 20, 23, 59, 59, 999999, tzinfo=dt.UTC)
    until = until + dt.timedelta(microseconds=1)
    wanted = {e.key for e in made if since <= instant_of(e) < until}
    assert 0 < len(wanted) < len(made) - 1  # boundaries on both sides
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    lines = [records.to_line(e, dt.datetime(2026, 11, 25, tzinfo=dt.UTC)) for e in made]
    (day / "part-a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    code, _out, err = run_replay(
        ["--archive", str(tmp_path / "archive"), "--exchange", exchange,
         "--routing-key", "replayed", "--since", since.isoformat(),
         "--until", until.isoformat(), "--out", str(tmp_path / "out")],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    assert sorted(e.key for e, _ in received(queue)) == sorted(wanted)
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert counts["filtered_out"] == len(made) - len(wanted)
    assert counts["malformed"] == 0


def test_spark_reads_an_instant_only_where_it_reads_it_as_the_service_does(spark: Any) -> None:
    """The SQL rule for ``--since``/``--until`` agrees with ``records.instant``
    wherever it gives a value, and leaves the rest to Python (``deferred``)."""
    from pyspark.sql import functions as F

    from dispatcher.pipeline import replay_read as replay

    texts = [
        *TIME_FORMS,
        "2026-11-20T00:14:00",  # no offset: no instant
        "2026-11-20 00:14:00Z",
        "9999-12-31T23:59:59-01:00",  # past year 9999 in UTC
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "0000-01-01T00:00:00Z",  # year 0: Spark's calendar has it, Python's has not
        "2026-11-20T00:14:00.1234567891234Z",
        "+12026-11-20T00:14:00Z",
        " 2026-11-20T00:14:00Z",
        "2026-11-20T00:14:00.Z",
        "2026-02-30T00:00:00Z",
        "yesterday",
    ]
    frame = spark.createDataFrame([(t,) for t in texts], "t STRING")
    rows = frame.select("t", replay._micros(F.col("t")).alias("us")).collect()
    read = {row["t"]: row["us"] for row in rows}
    for text in texts:
        attributes = {"specversion": "1.0", "id": "i", "source": "/s", "type": "t", "time": text}
        when = records.instant(Event(attributes, None))
        if read[text] is not None:
            assert when is not None, text
            assert replay.epoch_micros(when) == read[text], text
    assert sum(v is not None for v in read.values()) >= 8  # Spark places the usual forms


def test_the_copies_of_an_event_meet_in_the_one_shuffle_that_feeds_the_publishers(
    spark: Any, tmp_path: Path
) -> None:
    """Dedupe without more shuffles than it needs: the repartition by (source, id)
    into the publishing partitions is the grouping's too."""
    from dispatcher.pipeline import replay, replay_read

    write_archive(tmp_path / "archive", make_events(40))  # the first 30 twice
    options = replay.ReplayOptions(archive=str(tmp_path / "archive"), exchange="x", partitions=3)
    lines = replay_read.read(spark, options.archive)
    by_python = replay_read.read_in_python(spark, lines)
    counts = replay_read.select(spark, lines, by_python, options.selection, 3, tmp_path / "out")
    chosen, partitions = counts.chosen, counts.partitions
    plan = chosen._jdf.queryExecution().executedPlan().toString()
    assert plan.count("Exchange ") == 1, plan
    assert partitions == chosen.rdd.getNumPartitions() == 3
    assert (counts.lines, counts.malformed) == (40 + 30 + len(JUNK), len(JUNK))


def test_lines_spark_and_python_read_differently_are_still_published_or_rejected(
    spark: Any, target: tuple[str, str], tmp_path: Path, capsys: Any
) -> None:
    # Spark's JSON reader (Jackson) refuses a number of over 1,000 digits, which
    # the service reads and keeps to the digit; a name spelled with a lone
    # surrogate is a reject whose text no UTF-8 encoder takes (the job hung).
    # Data nested 980 deep, which the service and the archiver read, was "nested
    # too deeply" for Python read on the publisher's loop, frames deeper.
    exchange, queue = target
    big = Event({**make_events(1)[0].attributes, "id": "big"}, b'{"n":' + b"7" * 1500 + b"}")
    plain = make_events(2)[1]
    deep = Event({**make_events(1)[0].attributes, "id": "deep"}, b"[" * 980 + b"]" * 980)
    surrogate = b'{"specversion":"1.0","id":"s","source":"/s","type":"t","\\ud800":"x"}'
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    shallow = Event(deep.attributes, b"[]")
    deep_line = records.to_line(shallow, ARCHIVED_AT).replace(b'"data":[]', b'"data":' + deep.data)
    lines = [
        records.to_line(big, ARCHIVED_AT),
        surrogate,
        records.to_line(plain, ARCHIVED_AT),
        deep_line,
    ]
    (day / "part-a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    code, _out, err = replay_folder(tmp_path, exchange, capsys)
    assert code == 0, err
    got = {e.key: e for e, _ in received(queue)}
    assert sorted(got) == sorted([big.key, plain.key, deep.key])
    assert got[big.key].data == big.data
    assert got[deep.key].data == deep.data
    counts = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert (counts["published"], counts["malformed"], counts["lines"]) == (3, 1, 4)
    rejects = rejects_in(tmp_path / "out")
    assert [r["line"] for r in rejects] == [surrogate.decode()]
    assert "\ud800" in rejects[0]["reason"]
