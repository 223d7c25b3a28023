"""``dispatcher replay``: republish archived events to RabbitMQ, at scale.

The job, stage by stage:

1. read every ``*.jsonl`` and ``*.jsonl.gz`` below ``--archive`` (hidden
   files, such as an interrupted archiver's temp files, are skipped) with
   Spark's JSON reader, taking only what selection and dedupe need (``read``);
   a line it finds no source or id in is read by Python, those lines alone: a
   reject with the service's reason (it never stops the job), or an event
   after all (Jackson refuses some JSON Python reads, such as a number of over
   1,000 digits);
2. filter by ``--type``, ``--source``, ``--since`` (inclusive) and ``--until``
   (exclusive), compared as instants (``records.instant``'s rule, in SQL);
3. one shuffle, by (source, id) into the publishing partitions, gathers the
   copies of each event (the archive holds an event twice when an archiver was
   interrupted between its rename and its acks);
4. publish, per partition, with one long-lived connection and a pipelined
   confirm channel (``confirms.ConfirmedPublisher``), ordered by instant
   within the partition (an event whose time only Python reads goes first),
   at ``--rate`` / partitions each. Here, and only here,
   Python reads a line whole, with the service's validation (``records.from_line``):
   the first valid copy is published, a later valid one is a duplicate, an
   invalid one a reject. So a line outside the selection is read only as far
   as the selection needs: it counts as filtered out even if it would not
   have passed (unless its time is one only Python reads: then it is read
   whole to be placed, and a bad one is a reject).

Stages 1 to 3 are ``replay_read``, stage 4 ``replay_publish``; this module is the
command: its arguments, the stages in order, and what the job leaves behind.

The publish stage is the one action with side effects and runs once: its
results come back with ``collect()``, never recomputed. The exchange must
exist (one passive check on the driver); replay never declares it.

With a cluster's nodes in ``broker.url``, the driver's check connects to
the first node that answers, in the order given; each partition's publisher
goes round the nodes as the service's publisher does (a node lost
mid-partition leads to the next, unconfirmed records are sent again there,
and what is never confirmed ends in ``failed/``).

Outputs: one summary line on stdout, and in ``--out``: ``counts.json``,
``rejects/`` (JSON lines: file, line, reason) and ``failed/`` (records the
broker did not confirm, as archive lines: ``--archive OUT/failed`` retries
exactly them). Exit 0 when every selected record was published, 1 when some
failed, 2 when the job could not start.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.broker.params import connect_blocking, describe_error, nodes, redacted_urls
from dispatcher.config import BrokerSettings
from dispatcher.errors import BatchFailed, BatchInputError
from dispatcher.pipeline import inputs, progress, records, replay_publish, replay_read
from dispatcher.pipeline import spark as spark_session
from dispatcher.pipeline.confirms import PublishResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    archive: str
    exchange: str
    routing_key: str = ""
    type: str | None = None
    source: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None
    rate: float | None = None
    partitions: int | None = None
    out: str = "."

    @property
    def selection(self) -> replay_read.Selection:
        return replay_read.Selection(self.type, self.source, self.since, self.until)

    @property
    def target(self) -> replay_publish.Target:
        return replay_publish.Target(
            self.exchange, self.routing_key, self.rate, self.since, self.until
        )


@dataclass(slots=True)
class Counts:
    lines: int = 0
    malformed: int = 0
    filtered_out: int = 0
    skipped_duplicate: int = 0
    published: int = 0
    failed: int = 0
    resent: int = 0
    partitions: int = 0
    connections: int = 0
    seconds: float = 0.0
    failure_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def events_per_second(self) -> float:
        return round(self.published / self.seconds, 1) if self.seconds > 0 else 0.0


# --------------------------------------------------------------------- command


def command(args: argparse.Namespace, broker: BrokerSettings, stop: threading.Event) -> str:
    """``dispatcher replay`` inside the commands' frame (``dispatcher.cli``): the summary.
    A signal cancels the Spark job (the frame does); ``stop`` is looked at once more
    before the publishing starts, and says why the job ended."""
    spark_session.require_pyspark()
    options = _options(args)
    files = inputs.local_files([options.archive], replay_read.ARCHIVE_NAMES)
    inputs.check("--archive", files)
    check_exchange(broker, options.exchange)
    with spark_session.session("replay") as spark:
        try:
            counts = _replay_counting_published(spark, broker, options, stop)
        except Exception:
            if not stop.is_set():  # a signal's cancel is the frame's to say
                inputs.refuse_broken_gzip("--archive", files)
            raise
    line = _summary_line(counts, options)
    if counts.failed:
        raise BatchFailed(f"{counts.failed} events were not published", summary=line)
    return line


def _replay_counting_published(
    spark: SparkSession, broker: BrokerSettings, options: ReplayOptions, stop: threading.Event
) -> Counts:
    """``replay`` with the partitions' publishers reporting their confirmed counts to
    the driver: shown on a terminal (megabytes read, then events published), and
    said when a signal stops the job, whose results never come back."""
    shown = progress.Progress()
    host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    published: progress.PublishedCounts | None = None
    with contextlib.suppress(OSError):  # no socket for it here: no counts on the way
        published = progress.PublishedCounts(host)
    read = progress.SparkBytesRead(spark) if shown.enabled else None

    def now() -> tuple[float, str, str]:
        total = 0 if published is None else published.total()
        return (total, "events", "published") if total or read is None else read()

    try:
        with shown.polling(now):
            address = None if published is None else published.address
            return replay(spark, broker, options, progress_to=address, stop=stop)
    except Exception as e:
        if stop.is_set():
            raise BatchFailed(_stopped(e, published)) from e
        raise
    finally:
        if published is not None:
            published.close()


class _StoppedBeforePublishing(Exception):
    pass


def _stopped(error: Exception, published: progress.PublishedCounts | None) -> str:
    """What a signal's stop left behind: the partitions report every fraction of a
    second and a cancelled one sends no last report, so a count is a lower bound."""
    said = "replay stopped by a signal before it finished"
    if isinstance(error, _StoppedBeforePublishing):
        return f"{said}: nothing was published"
    if published is None:
        return f"{said}: some events may have been published (a new run publishes them again)"
    return (
        f"{said}: at least {published.total():,} events were published (confirmed by the "
        "broker) before the stop; a new run publishes them again"
    )


def _options(args: argparse.Namespace) -> ReplayOptions:
    if "://" not in args.archive and not Path(args.archive).is_dir():  # hdfs:// etc.: Spark's
        raise BatchInputError(f"--archive {args.archive}: not a folder")
    if args.since and args.until and args.since >= args.until:
        raise BatchInputError("--since must be before --until")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or f"replay-{stamp}"
    failed = (Path(out) / "failed").resolve()
    archive = Path(args.archive).resolve()
    if archive == failed or failed in archive.parents:
        # This run replaces OUT/failed: it must not be reading from it.
        raise BatchInputError(
            f"--archive {args.archive} is this run's failed/ folder: use another --out"
        )
    return ReplayOptions(
        archive=args.archive,
        exchange=args.exchange,
        routing_key=args.routing_key,
        type=args.type,
        source=args.source,
        since=args.since,
        until=args.until,
        rate=args.rate,
        partitions=args.partitions,
        out=out,
    )


def check_exchange(broker: BrokerSettings, exchange: str) -> None:
    """Fail fast, on the driver, when the exchange does not exist (replay never declares it)."""
    if exchange == "":
        return  # the default exchange always exists
    import pika
    import pika.exceptions

    try:
        connection, _node = connect_blocking(nodes(broker, "replay-check"))
    except Exception as e:  # pika's connection errors, translated here
        raise BatchInputError(
            f"cannot connect to the broker at {redacted_urls(broker)}: {describe_error(e)}"
        ) from None
    try:
        connection.channel().exchange_declare(exchange, passive=True)
    except pika.exceptions.ChannelClosedByBroker as e:
        raise BatchInputError(
            f"--exchange {exchange}: {e.reply_code} {e.reply_text} (replay never declares it)"
        ) from None
    finally:
        if connection.is_open:
            connection.close()


def _summary_line(counts: Counts, options: ReplayOptions) -> str:
    text = (
        f"replayed to exchange {options.exchange!r}: published {counts.published}, "
        f"skipped {counts.skipped_duplicate} as duplicate, {counts.filtered_out} filtered out, "
        f"{counts.malformed} malformed, {counts.failed} failed, of {counts.lines} lines, in "
        f"{counts.seconds:.1f}s ({counts.events_per_second} events/s, "
        f"{counts.partitions} partitions, {counts.connections} connections); "
        f"counts in {options.out}/counts.json"
    )
    if counts.failure_reasons:
        reasons = ", ".join(f"{n} {why}" for why, n in counts.failure_reasons.items())
        text += f"\nfailed: {reasons}; retry them with --archive {options.out}/failed"
    return text


# --------------------------------------------------------------------- the job


def replay(
    spark: SparkSession,
    broker: BrokerSettings,
    options: ReplayOptions,
    progress_to: tuple[str, int] | None = None,
    stop: threading.Event | None = None,
) -> Counts:
    """The job; ``progress_to``: where the partitions send their published counts
    (``progress.PublishedCounts``); ``stop``: set by a signal, whose cancel of a
    Spark job that ends within one of its polls could be missed; nothing is
    published once it is set."""
    from pyspark import StorageLevel

    started = time.monotonic()
    out = Path(options.out).resolve()  # the partitions write rejects there, wherever they run
    shutil.rmtree(out / "failed", ignore_errors=True)  # a previous run's, now stale
    with _nothing_published_yet(stop):
        lines = replay_read.read(spark, options.archive).persist(StorageLevel.MEMORY_AND_DISK)
    # Counted, written and published from: read by Python once.
    by_python = replay_read.read_in_python(spark, lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with _nothing_published_yet(stop):
            selected = replay_read.select(
                spark, lines, by_python, options.selection, options.partitions, out / "rejects"
            )
        results = replay_publish.publish(
            selected.chosen,
            selected.partitions,
            broker,
            options.target,
            progress_to,
            out / "rejects",
        )
    finally:
        by_python.unpersist()
        lines.unpersist()
    counts = Counts(
        lines=selected.lines, malformed=selected.malformed, filtered_out=selected.filtered_out
    )
    _settle(counts, results, selected.partitions)
    counts.seconds = round(time.monotonic() - started, 3)
    _write_failed(out / "failed", [r.published for r in results])
    _write_counts(out / "counts.json", counts)
    return counts


@contextlib.contextmanager
def _nothing_published_yet(stop: threading.Event | None) -> Iterator[None]:
    """A stage before the publishing: what fails while a signal's ``stop`` is set
    failed because the signal cancelled it, and a stage that ends after the signal
    leaves the publishing unstarted (``_StoppedBeforePublishing`` either way)."""
    try:
        yield
    except Exception as e:
        if stop is not None and stop.is_set():
            raise _StoppedBeforePublishing from e
        raise
    if stop is not None and stop.is_set():
        raise _StoppedBeforePublishing


def _settle(counts: Counts, results: list[replay_publish.PartitionResult], partitions: int) -> None:
    """The partitions' results added to ``counts``."""
    counts.partitions = partitions
    reasons: Counter[str] = Counter()
    for result in results:
        counts.malformed += result.rejected
        counts.skipped_duplicate += result.duplicates
        counts.filtered_out += result.filtered_out
        counts.published += result.published.published
        counts.failed += result.published.failed
        counts.resent += result.published.resent
        counts.connections += result.published.connections
        reasons.update(result.published.reasons)
    counts.failure_reasons = dict(reasons.most_common())


# --------------------------------------------------------------------- outputs


def _write_failed(folder: Path, results: list[PublishResult]) -> None:
    failed = [record for result in results for record in result.failed_records]
    if not failed:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "failed.jsonl").open("wb") as stream:
        for record in failed:
            stream.write(records.line(replay_publish.as_event(record)) + b"\n")


def _write_counts(path: Path, counts: Counts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**asdict(counts), "events_per_second": counts.events_per_second}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
