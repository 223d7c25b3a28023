"""`dispatcher archive` against the shared broker: what is archived, what stays, exit codes."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import yaml

from dispatcher.config import BrokerSettings
from dispatcher.errors import BatchFailed, BatchInputError
from dispatcher.event import amqp as amqp_binding
from dispatcher.event import cloudevent as events
from dispatcher.event.cloudevent import AmqpMessage, Event
from dispatcher.pipeline import records
from dispatcher.pipeline.archive import ArchiveResult, archive
from dispatcher.pipeline.progress import ERASE
from tests.support import broker
from tests.support.broker import event_headers, publish
from tests.support.process import child_env
from tests.support.proxy import FaultProxy
from tests.support.raw_amqp import RawPublisher, properties, table, timestamp
from tests.support.terminal import run_on_terminal

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
PART = re.compile(r"^part-\d{8}T\d{6}Z-[0-9a-f]{12}\.jsonl$")
TEMP = re.compile(r"^\.part-\d{8}T\d{6}Z-[0-9a-f]{12}\.jsonl\.tmp$")
SUMMARY = re.compile(r"^archived (\d+) events? into (\d+) files? under (.+) \(queue (.+)\)$")
SETTINGS = BrokerSettings(url=broker.URL)


@pytest.fixture
def queue() -> Iterator[str]:
    name = broker.unique("archive")
    with broker.channel() as ch:
        ch.queue_declare(name, durable=True)
    yield name
    with contextlib.suppress(Exception):  # a test may have deleted it already
        broker.delete([name])


# --------------------------------------------------------------------- helpers


class Running:
    """``archive`` on a thread of its own, so a test can act while it runs."""

    def __init__(self, queue: str, out: Path, **options: Any) -> None:
        self.stop: threading.Event = options.setdefault("stop", threading.Event())
        self._outcome: list[ArchiveResult | BaseException] = []
        broker_settings = options.pop("broker", SETTINGS)
        self.thread = threading.Thread(
            target=self._run, args=(queue, out, broker_settings, options), daemon=True
        )
        self.thread.start()

    def _run(self, queue: str, out: Path, settings: BrokerSettings, options: Any) -> None:
        try:
            self._outcome.append(archive(queue, out, settings, **options))
        except BaseException as e:  # handed to the test thread
            self._outcome.append(e)

    def finish(self, timeout: float, what: str = "return") -> ArchiveResult | BaseException:
        """Bounded: waits ``timeout`` for it to end by itself, then stops it; fails if it
        had not ended."""
        self.thread.join(timeout)
        ended = not self.thread.is_alive()
        self.stop.set()
        self.thread.join(10)
        assert ended, f"archive did not {what} within {timeout}s"
        return self._outcome[0]


def run_archive(queue: str, out: Path, timeout: float = 60, **options: Any) -> ArchiveResult:
    """``archive`` bounded: a run that does not return fails the test."""
    outcome = Running(queue, out, **options).finish(timeout)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def fill(queue: str, ids: list[str], body: bytes = b'{"n":1}') -> None:
    """Publish many events fast (no per-message confirm), then check they all arrived."""
    with broker.channel() as ch:
        for event_id in ids:
            ch.basic_publish(
                "",
                queue,
                body,
                pika.BasicProperties(
                    headers=event_headers(event_id),
                    content_type="application/json",
                    delivery_mode=2,
                ),
            )
    broker.wait_until(
        lambda: broker.queue_depth(queue) == len(ids), 60, f"{len(ids)} messages in {queue}"
    )


def part_files(out: Path) -> list[Path]:
    """The archive's visible files; anything else must be a hidden temporary file."""
    visible = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        assert re.fullmatch(r"date=\d{4}-\d{2}-\d{2}", path.parent.name), path
        assert path.parent.parent == out, path
        if PART.match(path.name):
            visible.append(path)
        else:
            assert TEMP.match(path.name), f"unexpected file {path}"
    return visible


def read_archive(out: Path) -> list[tuple[Path, Event]]:
    """Every line of every visible file, parsed and validated (a bad line fails the test)."""
    found = []
    for path in part_files(out):
        data = path.read_bytes()
        assert data.endswith(b"\n"), f"{path} does not end with a newline"
        for number, line in enumerate(data.split(b"\n")[:-1], 1):
            try:
                found.append((path, records.from_line(line)))
            except Exception as e:
                raise AssertionError(f"{path}:{number} does not parse: {e}: {line[:200]!r}") from e
    return found


def remaining_ids(queue: str) -> list[str]:
    """The ids of the messages left in the queue, once no consumer holds any unacked."""
    broker.wait_until(
        lambda: consumers(queue) == 0, 20, f"the archiver's consumer on {queue} to be gone"
    )
    return [props.headers["ce-id"] for props, _body in broker.get_all(queue)]


def consumers(queue: str) -> int:
    with broker.channel() as ch:
        return int(ch.queue_declare(queue, passive=True).method.consumer_count)


def utc_today() -> str:
    return dt.datetime.now(dt.UTC).date().isoformat()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------- what gets archived


def test_every_kind_of_message_is_archived_in_its_date_folder_and_acked(queue, tmp_path):
    ce = {"ce-specversion": "1.0", "ce-source": "/tests", "ce-type": "dev.tests.event"}
    structured = {
        "specversion": "1.0",
        "id": "struct-1",
        "source": "/tests",
        "type": "dev.tests.event",
        "time": "2026-03-04T12:00:00Z",
        "datacontenttype": "application/json",
        "data": {"k": [1, 2]},
    }
    publish(queue, b'{"n": 1}', {**ce, "ce-id": "bin-1", "ce-time": "2026-01-02T10:00:00Z"})
    publish(queue, json.dumps(structured).encode(), content_type="application/cloudevents+json")
    # 23:30 at UTC-2 is already the next day in UTC: folders are UTC dates.
    publish(queue, b"{}", {**ce, "ce-id": "bin-offset", "ce-time": "2026-03-04T23:30:00-02:00"})
    publish(queue, b"\xff\x00raw", {**ce, "ce-id": "bin-notime"}, "application/octet-stream")
    publish(queue, b'{\n  "pretty": true\n}\n', {**ce, "ce-id": "bin-pretty"})
    publish(queue, b"hello", None, "text/plain", message_id="plain-1")
    publish(queue, b"no id", None, "text/plain")
    no_source = {k: v for k, v in ce.items() if k != "ce-source"}
    publish(queue, b"bad", {**no_source, "ce-id": "x"}, "text/plain", "bad-1")
    digest = amqp_binding.stable_digest(AmqpMessage(b"no id", {}, "text/plain"), queue)
    before = utc_today()

    result = run_archive(queue, tmp_path, idle_exit=1.0)

    today = {before, utc_today()}
    assert result == ArchiveResult(archived=8, files=result.files, stopped="idle")
    archived = {event.id: (path.parent.name, event) for path, event in read_archive(tmp_path)}
    assert len(archived) == 8, sorted(archived)
    folders = {event_id: folder.removeprefix("date=") for event_id, (folder, _) in archived.items()}
    assert folders.pop("bin-1") == "2026-01-02"
    assert folders.pop("struct-1") == "2026-03-04"
    assert folders.pop("bin-offset") == "2026-03-05"
    assert set(folders.values()) <= today, folders  # no time attribute: the day it was archived
    data = {event_id: event.data for event_id, (_, event) in archived.items()}
    assert json.loads(data["bin-1"] or b"") == {"n": 1}
    assert json.loads(data["struct-1"] or b"") == {"k": [1, 2]}
    assert data["bin-notime"] == b"\xff\x00raw"
    assert data["bin-pretty"] == b'{\n  "pretty": true\n}\n'  # one line, exact bytes
    assert data["plain-1"] == b"hello" and data[digest] == b"no id" and data["bad-1"] == b"bad"
    for wrapped in ("plain-1", digest, "bad-1"):
        event = archived[wrapped][1]
        assert event.type == amqp_binding.WRAPPED_TYPE
        assert event.source == f"rabbitmq://%2F/{queue}"
    bad = archived["bad-1"][1].attributes
    assert bad["dispatchererror"] == "malformed CloudEvent: missing required attribute(s): source"
    assert "dispatchererror" not in archived["plain-1"][1].attributes
    for _, event in archived.values():
        assert records.ARCHIVED in event.attributes
    assert broker.queue_depth(queue) == 0  # all acked: a close would have requeued the rest


def test_max_events_archives_exactly_n_and_leaves_the_rest_in_the_queue(queue, tmp_path):
    published = [f"m{i}" for i in range(25)]
    fill(queue, published)

    result = run_archive(queue, tmp_path, max_events=10, batch_size=4)

    assert (result.archived, result.stopped) == (10, "max-events")
    lines = read_archive(tmp_path)
    assert all(len(p.read_bytes().splitlines()) <= 4 for p in part_files(tmp_path))
    archived = [event.id for _, event in lines]
    left = remaining_ids(queue)
    assert len(archived) == 10 == len(set(archived))
    assert len(left) == 15 == len(set(left))
    assert set(archived) | set(left) == set(published)
    assert not set(archived) & set(left)


def test_max_events_below_the_batch_size_takes_only_what_it_needs(queue, tmp_path):
    published = [f"m{i}" for i in range(20)]
    fill(queue, published)

    result = run_archive(queue, tmp_path, max_events=3)

    assert (result.archived, result.files) == (3, 1)
    archived = [event.id for _, event in read_archive(tmp_path)]
    left = remaining_ids(queue)
    assert sorted(archived + left) == sorted(published)
    assert len(archived) == 3


def test_idle_exit_returns_once_the_queue_has_been_idle_that_long(queue, tmp_path):
    started = time.monotonic()

    result = run_archive(queue, tmp_path, timeout=15, idle_exit=0.5)

    took = time.monotonic() - started
    assert result == ArchiveResult(archived=0, files=0, stopped="idle")
    assert took >= 0.5, f"returned after {took:.2f}s, before being idle for 0.5s"
    assert part_files(tmp_path) == []


def test_a_partial_batch_is_written_after_the_flush_interval_while_running(queue, tmp_path):
    fill(queue, ["a", "b", "c"])
    running = Running(queue, tmp_path)
    try:
        broker.wait_until(lambda: part_files(tmp_path), 10, "a part file of the partial batch")
        assert running.thread.is_alive(), "archive returned without a stop condition"
        assert sorted(e.id for _, e in read_archive(tmp_path)) == ["a", "b", "c"]
    finally:
        running.stop.set()
    assert running.finish(10) == ArchiveResult(archived=3, files=1, stopped="stop")
    assert broker.queue_depth(queue) == 0


# --------------------------------------------------------------------- failures


def test_a_failed_write_acks_nothing_and_exits_1(queue, tmp_path):
    fill(queue, ["a", "b", "c"])
    (tmp_path / "date=2026-07-08").write_text("a file where the date folder should be")
    fixed = dt.datetime(2026, 7, 8, 12, tzinfo=dt.UTC)  # events have no time: this day

    with pytest.raises(BatchFailed) as caught:  # exit code 1
        run_archive(queue, tmp_path, idle_exit=5, now=lambda: fixed)

    assert "date=2026-07-08" in caught.value.message
    assert caught.value.summary is None  # nothing was archived
    assert sorted(remaining_ids(queue)) == ["a", "b", "c"]
    assert [p.name for p in tmp_path.rglob("*")] == ["date=2026-07-08"]


def test_a_lost_connection_stops_with_exit_1_and_loses_nothing(queue, tmp_path):
    published = [f"m{i}" for i in range(300)]
    fill(queue, published)
    proxy = FaultProxy(5672)
    running = Running(queue, tmp_path, broker=BrokerSettings(url=proxy.url), batch_size=50)
    try:
        broker.wait_until(lambda: part_files(tmp_path), 10, "a first part file")
        proxy.reset_all()
        error = running.finish(20, "notice the lost connection")
    finally:
        running.stop.set()
        proxy.close()

    assert isinstance(error, BatchFailed), error  # exit code 1
    assert "lost the connection to the broker" in error.message, error.message
    archived = [event.id for _, event in read_archive(tmp_path)]
    left = remaining_ids(queue)
    assert set(published) <= set(archived) | set(left)  # duplicates allowed, loss is not


def test_a_deleted_queue_ends_the_run_with_exit_1(queue, tmp_path):
    fill(queue, ["a"])
    running = Running(queue, tmp_path)
    try:
        broker.wait_until(lambda: part_files(tmp_path), 10, "the part file")
        broker.delete([queue])
        error = running.finish(10, "notice the cancelled consumer")
    finally:
        running.stop.set()
    assert isinstance(error, BatchFailed), error  # exit code 1
    assert "cancelled the consumer" in error.message


def test_a_stream_is_refused_at_its_first_message_with_exit_2(tmp_path):
    """A stream starts a consumer at its next message and keeps what it holds:
    "draining" one would archive only what came while archive ran, and again on
    every run. Refused (exit 2) at the first message, which stays in the stream."""
    stream = broker.unique("archive-stream")
    with broker.channel() as ch:
        ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
    running = Running(stream, tmp_path)
    sent = 0

    def refused() -> bool:
        # A stream's consumer sees only what comes after it started, and a stream
        # reports no consumers: publish until archive has met one.
        nonlocal sent
        if running.thread.is_alive():
            sent += 1
            publish(stream, b"{}", headers=event_headers(f"st-{sent}"))
        return not running.thread.is_alive()

    try:
        broker.wait_until(refused, 20, "archive to meet a message of the stream")
        error = running.finish(1, "refuse the stream")
    finally:
        running.stop.set()
        broker.delete([stream])
    assert isinstance(error, BatchInputError), error  # exit code 2
    assert f"queue {stream!r} is a stream" in str(error)
    assert not part_files(tmp_path)


# --------------------------------------------------------------------- the real command


def start_cli(*args: str, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    environ = child_env({"RABBITMQ_URL": broker.URL, **(env or {})})
    # Files, not pipes: a process that fills an unread pipe would block.
    return subprocess.Popen(
        [sys.executable, "-m", "dispatcher", "archive", *args],
        cwd=ROOT,
        env=environ,
        stdout=(out / "stdout").open("w"),
        stderr=(out / "stderr").open("w"),
        text=True,
    )


def run_cli(*args: str, tmp_path: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    process = start_cli(*args, out=tmp_path, env=env)
    try:
        code = process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return code, (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_an_interrupted_run_loses_nothing(queue, tmp_path, sig):
    published = [f"e{i}" for i in range(20_000)]
    fill(queue, published)
    out = tmp_path / "archive"
    process = start_cli("--queue", queue, "--out", str(out), "--batch-size", "200", out=tmp_path)
    try:
        # A few batches in: the signal lands mid-drain, most likely mid-batch.
        broker.wait_until(
            lambda: out.is_dir() and len(part_files(out)) >= 5, 30, "5 part files", 0.005
        )
        process.send_signal(sig)
        code = process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)

    stdout = (tmp_path / "stdout").read_text()
    archived = [event.id for _, event in read_archive(out)]
    left = remaining_ids(queue)
    assert left, "the queue was drained before the signal: the test did not interrupt a run"
    missing = set(published) - set(archived) - set(left)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert set(archived) | set(left) == set(published)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return  # duplicates are allowed: files written but not yet acked are redelivered
    assert code == 0, (tmp_path / "stderr").read_text()
    assert not list(out.rglob("*.tmp")), "a clean stop leaves no temporary file"
    assert len(archived) == len(set(archived)), "an event was archived twice"
    assert not set(archived) & set(left), "an archived event is still in the queue"
    summary = SUMMARY.match(stdout.splitlines()[-1])
    assert summary, stdout[-500:]
    assert int(summary[1]) == len(archived)
    assert int(summary[2]) == len(part_files(out))


def test_the_command_prints_a_summary_and_exits_0(queue, tmp_path):
    fill(queue, ["a", "b"])
    out = tmp_path / "archive"

    code, stdout, stderr = run_cli(
        "--queue", queue, "--out", str(out), "--idle-exit", "300ms", tmp_path=tmp_path
    )

    assert code == 0, stderr
    assert stdout.splitlines()[-1] == f"archived 2 events into 1 file under {out} (queue {queue})"
    assert "\r" not in stdout  # not a terminal: no progress line, the summary alone
    assert sorted(event.id for _, event in read_archive(out)) == ["a", "b"]


def test_on_a_terminal_progress_is_shown_then_erased_before_the_summary(queue, tmp_path):
    fill(queue, [f"t{i}" for i in range(3000)])
    out = tmp_path / "archive"
    code, screen = run_on_terminal(
        [sys.executable, "-m", "dispatcher", "archive", "--queue", queue, "--out", str(out),
         "--batch-size", "100", "--idle-exit", "500ms"],
        cwd=ROOT, env=child_env({"RABBITMQ_URL": broker.URL}), stderr=tmp_path / "stderr",
        timeout=60,
    )  # fmt: skip
    assert code == 0, (tmp_path / "stderr").read_text()
    progress, _, summary = screen.rpartition(ERASE)
    # The first batch is drawn at once; each line says count, rate and time.
    assert re.search(r"[0-9,]+ events archived, [0-9,]+ events/s, 0:[0-9]{2}", progress)
    found = SUMMARY.fullmatch(summary.rstrip("\n"))
    assert found and int(found[1]) == 3000, summary


def test_the_command_logs_as_the_config_file_says(queue, tmp_path):
    """The batch commands read the service's ``logging`` section, as ``run`` does."""
    fill(queue, ["a"])
    config = tmp_path / "dispatcher.yaml"
    config.write_text(yaml.safe_dump({"logging": {"level": "warning", "format": "console"}}))
    out = tmp_path / "archive"

    code, stdout, stderr = run_cli(
        "--queue", queue, "--out", str(out), "--idle-exit", "300ms", "--config", str(config),
        tmp_path=tmp_path,
    )  # fmt: skip

    assert code == 0, stderr
    # At info level the run logs "archive started"; at warning it says only its summary.
    assert "archive started" not in stdout + stderr
    assert stdout.splitlines() == [f"archived 1 event into 1 file under {out} (queue {queue})"]


def test_a_message_pika_cannot_decode_is_archived_with_the_reason(queue, tmp_path):
    """Dead-letter queues are where such messages end up (the queue's own DLX keeps
    their headers): archive must drain them, not lose its connection on each one."""
    fill(queue, ["good"])
    with RawPublisher() as raw:  # year 10000: pika's decode raises ValueError
        hostile = properties(headers=table([(b"t", timestamp(253402300800))]))
        assert raw.publish(queue, hostile, b"hostile body") == "ack"
    out = tmp_path / "archive"

    code, _stdout, stderr = run_cli(
        "--queue", queue, "--out", str(out), "--idle-exit", "300ms", tmp_path=tmp_path
    )

    assert code == 0, stderr
    by_data = {event.data: event for _, event in read_archive(out)}
    assert by_data[b'{"n":1}'].id == "good"
    archived = by_data[b"hostile body"]
    reason = archived.attributes["dispatchererror"]
    assert reason.startswith("unreadable AMQP properties: ValueError"), reason
    # The id the service gives the same message (its dead letter and log line):
    # it digests the property bytes, so two hostile messages with one body differ.
    unreadable = events.Unreadable("ValueError", hostile)
    expected, _ = amqp_binding.wrap_unreadable(
        AmqpMessage(b"hostile body", {}), "/", queue, unreadable
    )
    assert archived.id == expected.id
    assert broker.queue_depth(queue) == 0


def test_a_missing_queue_exits_2_naming_the_queue(tmp_path):
    missing = broker.unique("missing")

    code, stdout, stderr = run_cli(
        "--queue", missing, "--out", str(tmp_path / "a"), tmp_path=tmp_path
    )

    assert code == 2, stdout + stderr
    assert f"queue '{missing}' not found" in stderr
    assert "Traceback" not in stderr + stdout
    with broker.channel() as ch, pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch.queue_declare(missing, passive=True)  # and it was not declared either


def test_a_bad_broker_url_exits_2_naming_the_variable(tmp_path):
    code, stdout, stderr = run_cli(
        "--queue", "q", "--out", str(tmp_path / "a"), tmp_path=tmp_path,
        env={"RABBITMQ_URL": "http://x"},
    )  # fmt: skip

    assert code == 2, stdout + stderr
    assert stderr.startswith("dispatcher: RABBITMQ_URL: ")
    assert "Traceback" not in stderr + stdout


def test_an_unreachable_broker_exits_1_with_one_line_and_no_password(tmp_path):
    url = f"amqp://guest:hunter2@127.0.0.1:{free_port()}/%2F"

    code, stdout, stderr = run_cli(
        "--queue", "q", "--out", str(tmp_path / "a"), tmp_path=tmp_path,
        env={"RABBITMQ_URL": url},
    )  # fmt: skip

    assert code == 1, stdout + stderr
    assert stderr.count("\n") == 1 and stderr.startswith("dispatcher: cannot connect to the broker")
    assert "guest:***@127.0.0.1" in stderr
    assert "hunter2" not in stdout + stderr
    # What went wrong, not the name of pika's wrapper around it.
    assert "ConnectionRefusedError" in stderr, stderr


def test_a_tls_failure_on_the_first_node_moves_on_to_the_next(queue, tmp_path, capsys):
    """amqps:// to a plaintext port (or a certificate that does not verify): pika's
    blocking connection raises the ssl error itself, which crashed archive with a
    traceback and never tried the next node."""
    tls_to_plain = "amqps://guest:hunter2@127.0.0.1:5672/%2F"
    fill(queue, ["a"])

    settings = BrokerSettings(url=(tls_to_plain, broker.URL))
    result = run_archive(queue, tmp_path, broker=settings, max_events=1)

    assert (result.archived, result.stopped) == (1, "max-events")
    logged = capsys.readouterr().out
    [failed] = [line for line in logged.splitlines() if "trying the next node" in line]
    assert "SSL" in json.loads(failed)["error"], failed
    assert "hunter2" not in logged


def test_a_cluster_whose_first_node_is_down_is_drained_through_the_next(queue, tmp_path, capsys):
    dead = f"amqp://guest:hunter2@127.0.0.1:{free_port()}/%2F"
    fill(queue, ["a", "b"])

    settings = BrokerSettings(url=(dead, broker.URL))
    result = run_archive(queue, tmp_path, broker=settings, max_events=2)

    assert (result.archived, result.stopped) == (2, "max-events")
    assert sorted(event.id for _, event in read_archive(tmp_path)) == ["a", "b"]
    logged = capsys.readouterr().out
    assert '"node": "127.0.0.1:5672"' in logged and "hunter2" not in logged


def test_a_cluster_with_no_node_up_fails_naming_every_node_without_passwords(tmp_path):
    dead = [f"amqp://guest:hunter2@127.0.0.1:{free_port()}/%2F" for _ in range(2)]

    with pytest.raises(BatchFailed) as caught:
        archive("q", tmp_path, BrokerSettings(url=tuple(dead)), max_events=1)

    shown = caught.value.message
    ports = [url.split(":")[-1].split("/")[0] for url in dead]
    where = ", ".join(f"amqp://guest:***@127.0.0.1:{port}/%2F" for port in ports)
    assert shown.startswith(f"cannot connect to the broker at {where}: "), shown
    assert "hunter2" not in shown


def test_every_archived_message_is_acked_on_its_own_after_its_file_exists(
    queue, tmp_path, monkeypatch
):
    # Invariant 3 (and 1): a multiple ack would settle whatever else is unacked on
    # the channel; an ack before the file is in place could lose the message.
    acks: list[tuple[int, bool, int]] = []
    original = pika.adapters.blocking_connection.BlockingChannel.basic_ack

    def spy(channel, delivery_tag=0, multiple=False):
        acks.append((delivery_tag, multiple, len(part_files(tmp_path))))
        return original(channel, delivery_tag=delivery_tag, multiple=multiple)

    monkeypatch.setattr(pika.adapters.blocking_connection.BlockingChannel, "basic_ack", spy)
    fill(queue, [f"s{i}" for i in range(10)])
    result = run_archive(queue, tmp_path, max_events=10, batch_size=4)
    assert result.archived == 10
    assert len(acks) == 10 and len({tag for tag, _, _ in acks}) == 10
    assert not any(multiple for _, multiple, _ in acks)
    # The k-th ack comes after the file of its batch (batches hold at most 4) exists.
    assert all(files >= k // 4 + 1 for k, (_, _, files) in enumerate(acks)), acks
