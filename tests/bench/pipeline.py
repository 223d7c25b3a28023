"""`make bench` (batch side): `dispatcher report` over 1M log lines, `dispatcher replay`
of 100k archived events, and the replay against single-process publishers.

Each command runs as users run it (a fresh process, Spark on local[*]), so wall
times include JVM start-up; the replay's own job time (``counts.json``) is
shown beside it. The baselines publish the same archived events from one
process: pika's ``BlockingChannel`` with a confirm per message (as usually
written), and ``ConfirmedPublisher`` alone (replay's publisher without Spark);
a third reads the archive itself, as a user's own script would (the parse
inside the clock); the last row is the broker's confirm rate with one
publishing process per replay partition, the ceiling replay is compared with.
Results are checked, not assumed: the report's record count, and every
replayed id in the queue exactly once.

    python tests/bench/pipeline.py [--lines 1000000] [--events 100000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dispatcher.event import amqp as amqp_binding  # noqa: E402
from dispatcher.event.cloudevent import Event  # noqa: E402
from dispatcher.pipeline import records  # noqa: E402
from dispatcher.pipeline.confirms import ConfirmedPublisher, Outgoing  # noqa: E402
from tests.support import delivery_logs  # noqa: E402

URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
ENV = {**os.environ, "RABBITMQ_URL": URL, "PYTHONPATH": str(ROOT)}


def run(argv: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dispatcher", *argv],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"dispatcher {argv[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed, done.stdout


# --------------------------------------------------------------------- report


def bench_report(folder: Path, lines: int) -> dict[str, float]:
    logs = folder / "logs"
    generated = delivery_logs.write_logs(logs, lines, files=8)
    records_in = sum(1 for line in generated if delivery_logs.classify(line)[0] == "record")
    elapsed, _ = run(["report", "--logs", str(logs), "--out", str(folder / "report")])
    counts = json.loads((folder / "report" / "counts.json").read_text())
    if counts["records"] != records_in or counts["lines"] != len(generated):
        raise SystemExit(f"report counted {counts}, expected {records_in} of {len(generated)}")
    return {"lines": len(generated), "seconds": elapsed, "per_second": len(generated) / elapsed}


# --------------------------------------------------------------------- replay


def write_archive(folder: Path, count: int) -> list[Event]:
    day = folder / "date=2026-11-20"
    day.mkdir(parents=True)
    archived_at = dt.datetime(2026, 11, 20, 12, tzinfo=dt.UTC)
    made = []
    pad = "x" * 900
    files = 8
    for n in range(files):
        with (day / f"part-{n}.jsonl").open("wb") as stream:
            for i in range(n, count, files):
                event = Event(
                    {
                        "specversion": "1.0",
                        "id": f"bench-{i}",
                        "source": "/bench",
                        "type": "dev.dispatcher.bench",
                        "datacontenttype": "application/json",
                        "time": f"2026-11-20T10:{i // 60 % 60:02d}:{i % 60:02d}Z",
                    },
                    b'{"n":%d,"pad":"%s"}' % (i, pad.encode()),
                )
                made.append(event)
                stream.write(records.to_line(event, archived_at) + b"\n")
    return made


def fresh_queue() -> str:
    name = f"bench-replay-{uuid.uuid4().hex[:8]}"
    with pika.BlockingConnection(pika.URLParameters(URL)) as connection:
        connection.channel().queue_declare(name, durable=True)
    return name


def check_and_delete(queue: str, expected: int) -> None:
    """Every id in the queue exactly once."""
    seen: set[str] = set()
    with pika.BlockingConnection(pika.URLParameters(URL)) as connection:
        channel = connection.channel()
        while True:
            method, properties, _body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            event_id = properties.headers["ce-id"]
            if event_id in seen:
                raise SystemExit(f"{event_id} arrived twice in {queue}")
            seen.add(event_id)
        channel.queue_delete(queue)
    if len(seen) != expected:
        raise SystemExit(f"{queue} held {len(seen)} events, expected {expected}")


def bench_replay(folder: Path, archive: Path, count: int) -> dict[str, float]:
    queue = fresh_queue()
    out = folder / f"replay-{queue}"
    elapsed, _ = run(
        ["replay", "--archive", str(archive), "--exchange", "", "--routing-key", queue,
         "--out", str(out)]
    )  # fmt: skip
    counts = json.loads((out / "counts.json").read_text())
    check_and_delete(queue, count)
    return {
        "seconds": elapsed,
        "per_second": count / elapsed,
        "job_seconds": counts["seconds"],
        "job_per_second": counts["events_per_second"],
        "partitions": counts["partitions"],
    }


def outgoing(made: list[Event]) -> list[Outgoing]:
    result = []
    for event in made:
        headers, content_type = amqp_binding.to_amqp_headers(event)
        result.append(Outgoing(event.key, event.data or b"", headers, content_type))
    return result


def bench_single_process(made: list[Event], pipelined: bool) -> dict[str, float]:
    queue = fresh_queue()
    messages = outgoing(made)
    started = time.perf_counter()
    if pipelined:
        result = ConfirmedPublisher([pika.URLParameters(URL)], "", queue).publish(messages)
        assert result.published == len(messages), result
    else:
        with pika.BlockingConnection(pika.URLParameters(URL)) as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for m in messages:
                channel.basic_publish(
                    "",
                    queue,
                    m.body,
                    pika.BasicProperties(
                        headers=m.headers, content_type=m.content_type, delivery_mode=2
                    ),
                    mandatory=True,
                )
    elapsed = time.perf_counter() - started
    check_and_delete(queue, len(made))
    return {"seconds": elapsed, "per_second": len(made) / elapsed}


def bench_script(archive: Path, count: int) -> dict[str, float]:
    """What a user's own replay script does in one process, reading inside the
    clock: each archive line parsed and checked (``records.from_line``), duplicates
    skipped, each event published with ``ConfirmedPublisher`` as it is read."""
    queue = fresh_queue()

    def messages() -> Iterator[Outgoing]:
        seen: set[tuple[str, str]] = set()
        for path in sorted(archive.rglob("*.jsonl")):
            with path.open("rb") as stream:
                for line in stream:
                    event = records.from_line(line)
                    if event.key in seen:
                        continue
                    seen.add(event.key)
                    replayed = records.for_replay(event)
                    headers, content_type = amqp_binding.to_amqp_headers(replayed)
                    yield Outgoing(event.key, replayed.data or b"", headers, content_type)

    started = time.perf_counter()
    result = ConfirmedPublisher([pika.URLParameters(URL)], "", queue).publish(messages())
    elapsed = time.perf_counter() - started
    assert result.published == count, result
    check_and_delete(queue, count)
    return {"seconds": elapsed, "per_second": count / elapsed}


_SLICES: list[list[Outgoing]] = []  # set before the fork: each child publishes one


def _publish_slice(index: int, queue: str) -> int:
    result = ConfirmedPublisher([pika.URLParameters(URL)], "", queue).publish(_SLICES[index])
    return result.published


def bench_broker_alone(made: list[Event], publishers: int) -> dict[str, float]:
    """The broker's confirm rate with as many publishers as replay has partitions,
    each a process of its own with ``ConfirmedPublisher`` (window 1,000) and its
    messages built before the clock starts: the ceiling replay can approach."""
    import multiprocessing

    queue = fresh_queue()
    messages = outgoing(made)
    _SLICES[:] = [messages[i::publishers] for i in range(publishers)]
    with multiprocessing.get_context("fork").Pool(publishers) as pool:
        started = time.perf_counter()
        published = sum(pool.starmap(_publish_slice, [(i, queue) for i in range(publishers)]))
        elapsed = time.perf_counter() - started
    assert published == len(messages), published
    check_and_delete(queue, len(made))
    return {"seconds": elapsed, "per_second": len(made) / elapsed}


# --------------------------------------------------------------------- table


def cell(values: list[float], fmt: str) -> str:
    middle = format(statistics.median(values), fmt)
    if len(values) == 1:
        return middle
    return f"{middle} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def repeat(times: int, measure: Callable[[], dict[str, float]]) -> list[dict[str, float]]:
    return [measure() for _ in range(times)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="delivery records to report")
    parser.add_argument("--events", type=int, default=100_000, help="archived events to replay")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dispatcher-bench-") as temp:
        folder = Path(temp)
        print(f"generating {args.lines} delivery records and {args.events} archived events ...")
        made = write_archive(folder / "archive", args.events)
        report = repeat(args.repeat, lambda: bench_report(folder, args.lines))
        rows = []
        replay: list[dict[str, float]] = []
        sync: list[dict[str, float]] = []
        pipelined: list[dict[str, float]] = []
        script: list[dict[str, float]] = []
        alone: list[dict[str, float]] = []
        for _ in range(args.repeat):  # interleaved: A B C D E A B C D E
            replay.append(bench_replay(folder, folder / "archive", args.events))
            sync.append(bench_single_process(made, pipelined=False))
            pipelined.append(bench_single_process(made, pipelined=True))
            script.append(bench_script(folder / "archive", args.events))
            alone.append(bench_broker_alone(made, int(replay[-1]["partitions"])))
    lines = int(report[0]["lines"])
    rows.append(
        (f"`dispatcher report` ({lines:,} lines, 8 files, half gzip)",
         cell([r["seconds"] for r in report], ".1f"),
         cell([r["per_second"] for r in report], ",.0f") + " lines/s")
    )  # fmt: skip
    rows.append(
        (f"`dispatcher replay` ({args.events:,} events, "
         f"{int(replay[0]['partitions'])} partitions), whole command",
         cell([r["seconds"] for r in replay], ".1f"),
         cell([r["per_second"] for r in replay], ",.0f") + " events/s")
    )  # fmt: skip
    rows.append(
        ("`dispatcher replay`, the job alone (counts.json, no JVM start)",
         cell([r["job_seconds"] for r in replay], ".1f"),
         cell([r["job_per_second"] for r in replay], ",.0f") + " events/s")
    )  # fmt: skip
    rows.append(
        ("one process, pika `BlockingChannel`, a confirm per message",
         cell([r["seconds"] for r in sync], ".1f"),
         cell([r["per_second"] for r in sync], ",.0f") + " events/s")
    )  # fmt: skip
    rows.append(
        ("one process, `ConfirmedPublisher` (window 1,000), no Spark",
         cell([r["seconds"] for r in pipelined], ".1f"),
         cell([r["per_second"] for r in pipelined], ",.0f") + " events/s")
    )  # fmt: skip
    rows.append(
        ("one process reading the archive: each line parsed, duplicates skipped, "
         "`ConfirmedPublisher`, no Spark",
         cell([r["seconds"] for r in script], ".1f"),
         cell([r["per_second"] for r in script], ",.0f") + " events/s")
    )  # fmt: skip
    rows.append(
        (f"the broker alone: {int(replay[0]['partitions'])} processes (one per replay "
         "partition), `ConfirmedPublisher` each, messages built before the clock",
         cell([r["seconds"] for r in alone], ".1f"),
         cell([r["per_second"] for r in alone], ",.0f") + " events/s")
    )  # fmt: skip
    print(f"\n{os.cpu_count()} CPUs, broker at {URL.split('@')[-1]}, repeat {args.repeat}\n")
    print("| run | wall s | rate |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
