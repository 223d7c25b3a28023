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
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from dispatcher import amqp_binding
from dispatcher.broker.params import connect_blocking, describe_error, nodes, redacted_urls
from dispatcher.config import BrokerSettings
from dispatcher.errors import BatchFailed, BatchInputError, EventError
from dispatcher.events import Event
from dispatcher.pipeline import inputs, progress, records
from dispatcher.pipeline import spark as spark_session
from dispatcher.pipeline.confirms import TURN, ConfirmedPublisher, Outgoing, PublishResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ARCHIVE_FILES: Final = "*.{jsonl,jsonl.gz}"
ARCHIVE_NAMES: Final = ("*.jsonl", "*.jsonl.gz")  # the same, as fnmatch reads names
# What Spark's JSON reader takes from each line: what selection and dedupe need.
SELECTION_SCHEMA: Final = (
    f"source STRING, id STRING, type STRING, time STRING, {records.ARCHIVED} STRING"
)
# What Python reads of a line Spark's reader could not (``_read_in_python``).
BY_PYTHON_SCHEMA: Final = (
    "file STRING, value STRING, source STRING, id STRING, type STRING, "
    "instant_us BIGINT, reason STRING"
)
# The RFC 3339 form Spark and ``records.instant`` (dateutil's isoparse) read alike,
# after upper-casing and with basic offsets (+0100, +01) given their colon. Other
# texts isoparse reads (week dates, ``T24:00``, no seconds, an offset past Spark's
# 18 hours) are left to Python, at publish; so is year 0000, which Spark's
# calendar holds and Python's does not (it has no instant there).
_BASIC_OFFSET: Final = r"(:\d\d(?:\.\d+)?[+-]\d\d)(\d\d)$"
_HOURS_OFFSET: Final = r"(:\d\d(?:\.\d+)?[+-]\d\d)$"
_RFC3339: Final = r"^(?!0000)\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$"


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
    files = inputs.local_files([options.archive], ARCHIVE_NAMES)
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
        lines = read(spark, options.archive).persist(StorageLevel.MEMORY_AND_DISK)
    # Counted, written and published from: read by Python once.
    by_python = read_in_python(spark, lines).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with _nothing_published_yet(stop):
            counts, chosen, partitions = _tally(spark, lines, by_python, options, out)
        results = publish(chosen, partitions, broker, options, progress_to, out / "rejects")
    finally:
        by_python.unpersist()
        lines.unpersist()
    _settle(counts, results, partitions)
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


def read(spark: SparkSession, archive: str) -> DataFrame:
    """Every archive line (``file``, ``value``) with what the selection and the
    dedupe need, read by Spark's JSON reader: ``source``, ``id``, ``type``, the
    instant in microseconds (``records.instant``'s rule: ``time``, else the archive
    time), ``deferred`` when that rule needs Python to place it (a time in a form
    Spark does not read as isoparse does), and ``readable`` (it has a source and an
    id). No Python runs here: the rest of a line is read, with the service's own
    validation, only where it is about to be published."""
    from pyspark.sql import functions as F

    fields = F.from_json("value", SELECTION_SCHEMA)
    given = F.coalesce(F.col("f.time"), F.col(f"f.{records.ARCHIVED}"))
    return (
        spark.read.option("recursiveFileLookup", "true")
        .option("pathGlobFilter", ARCHIVE_FILES)
        .text(archive)
        .select(F.input_file_name().alias("file"), "value", fields.alias("f"))
        .select(
            "file",
            "value",
            "f.source",
            "f.id",
            "f.type",
            _micros(given).alias("instant_us"),
            given.isNotNull().alias("timed"),
            (F.col("f.source").isNotNull() & F.col("f.id").isNotNull()).alias("readable"),
        )
        .withColumn("deferred", F.col("timed") & F.col("instant_us").isNull())
        .drop("timed")
    )


def _micros(given: Any) -> Any:
    """An RFC 3339 time as microseconds since the epoch; null for any other text."""
    from pyspark.sql import functions as F

    text = F.upper(given)  # RFC 3339 allows "t" and "z"; Spark reads the capitals
    # ISO 8601's basic offsets, which isoparse reads and producers write (strftime's
    # %z): +0100 and +01 become +01:00, so few times are left for Python to place.
    text = F.regexp_replace(text, _BASIC_OFFSET, "$1:$2")
    text = F.regexp_replace(text, _HOURS_OFFSET, "$1:00")
    return F.when(text.rlike(_RFC3339), F.unix_micros(F.try_to_timestamp(text)))


def read_in_python(spark: SparkSession, lines: DataFrame) -> DataFrame:
    """The lines Spark's reader found no (source, id) in, read by Python, these
    alone: a reject with the service's ``reason``, or an event after all (Jackson
    refuses what Python reads, such as a number of over 1,000 digits in the
    data), with the columns ``read`` gives an event."""
    from pyspark.sql import functions as F

    python = lines.where(~F.col("readable")).select("file", "value").rdd.map(_read_in_python)
    return spark.createDataFrame(python, BY_PYTHON_SCHEMA).withColumn("deferred", F.lit(False))


def _tally(
    spark: SparkSession,
    lines: DataFrame,
    by_python: DataFrame,
    options: ReplayOptions,
    out: Path,
) -> tuple[Counts, DataFrame, int]:
    """The counts known before publishing, the rejects of lines Spark could not
    read written, and the selected events (a row per (source, id) with every
    copy) over how many partitions."""
    from pyspark.sql import functions as F

    counts = Counts()
    readable = F.col("readable")
    selection = _selection(options)
    totals = lines.agg(
        F.count(F.lit(1)).alias("lines"),
        F.sum(F.when(readable & ~selection, 1).otherwise(0)).alias("filtered_out"),
    ).first()
    assert totals is not None
    counts.lines = int(totals["lines"])
    counts.filtered_out = int(totals["filtered_out"] or 0)
    refused = F.col("reason").isNotNull()
    small = by_python.agg(
        F.sum(F.when(refused, 1).otherwise(0)).alias("malformed"),
        F.sum(F.when(~refused & ~selection, 1).otherwise(0)).alias("filtered_out"),
    ).first()
    assert small is not None
    counts.malformed = int(small["malformed"] or 0)
    counts.filtered_out += int(small["filtered_out"] or 0)
    by_python.where(refused).select("file", F.col("value").alias("line"), "reason").write.mode(
        "overwrite"
    ).json(str(out / "rejects"))
    events = lines.where(readable & selection).select(*_EVENT_COLUMNS)
    events = events.unionByName(by_python.where(~refused & selection).select(*_EVENT_COLUMNS))
    partitions = options.partitions or spark.sparkContext.defaultParallelism
    # The one shuffle: by (source, id) into the publishing partitions, so that the
    # grouping of an event's copies needs no other (the plan has one Exchange).
    chosen = (
        events.repartition(partitions, "source", "id")
        .groupBy("source", "id")
        .agg(
            F.min("instant_us").alias("instant_us"),
            F.sort_array(F.collect_list(F.struct("file", "value", "deferred"))).alias("copies"),
        )
        .sortWithinPartitions("instant_us", "source", "id")
    )
    return counts, chosen, partitions


_EVENT_COLUMNS: Final = ("file", "value", "source", "id", "type", "instant_us", "deferred")


def _read_in_python(row: Any) -> tuple[Any, ...]:
    """Runs on executors, for a line Spark's reader found no (source, id) in:
    (file, value, source, id, type, instant_us, reason), with the service's
    reason when it is no event either."""
    file, value = row["file"], row["value"]
    try:
        event = records.from_line(value)
    except EventError as e:
        return file, value, None, None, None, None, e.reason
    when = records.instant(event)
    instant = None if when is None else _epoch_micros(when)
    return file, value, event.source, event.id, event.type, instant, None


def _settle(counts: Counts, results: list[PartitionResult], partitions: int) -> None:
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


def _selection(options: ReplayOptions) -> Any:
    from pyspark.sql import functions as F

    condition = F.lit(True)
    if options.type is not None:
        condition = condition & (F.col("type") == options.type)
    if options.source is not None:
        condition = condition & (F.col("source") == options.source)
    # An event with no instant at all cannot be placed in a time range; one that
    # Python places is in the selection until Python has (``_Copies``).
    since, until = _epoch_micros(options.since), _epoch_micros(options.until)
    if since is not None:
        condition = condition & (F.col("deferred") | (F.col("instant_us") >= since))
    if until is not None:
        condition = condition & (F.col("deferred") | (F.col("instant_us") < until))
    return F.coalesce(condition, F.lit(False))


def _epoch_micros(when: dt.datetime | None) -> int | None:
    if when is None:
        return None
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """What one partition did: its publisher's result, and what its reading of the
    copies found besides the events it published."""

    published: PublishResult
    duplicates: int
    rejected: int
    filtered_out: int


def publish(
    chosen: DataFrame,
    partitions: int,
    broker: BrokerSettings,
    options: ReplayOptions,
    progress_to: tuple[str, int] | None = None,
    rejects: Path | None = None,
) -> list[PartitionResult]:
    exchange, routing_key = options.exchange, options.routing_key
    rate = options.rate / partitions if options.rate else None

    def publish_partition(index: int, rows: Iterable[Any]) -> Iterator[PartitionResult]:
        # Runs on an executor: one connection at a time for the whole partition.
        candidates = [node.parameters for node in nodes(broker, f"replay-{index}")]
        sender = None if progress_to is None else progress.PublishedSender(progress_to, index)
        publisher = None
        copies = _Copies(
            None if rejects is None else rejects / f"part-{index:05d}-replay.json",
            options.since,
            options.until,
        )
        limit = sys.getrecursionlimit()
        try:
            sys.setrecursionlimit(limit + _LOOP_FRAMES)
            publisher = ConfirmedPublisher(
                candidates, exchange, routing_key, rate=rate, on_progress=sender
            )
            result = publisher.publish(copies.outgoing(rows))
        except Exception as e:
            # Spark's worker sends a task's error to the JVM as UTF-8 and, failing to
            # encode one (a lone surrogate from a line's text), never reports the task
            # at all: the job waited for ever. Only ASCII leaves the partition.
            raise RuntimeError(
                f"replay partition {index}: {type(e).__name__}: {e!s:.2000}".encode(
                    "ascii", "backslashreplace"
                ).decode("ascii")
            ) from None
        finally:
            sys.setrecursionlimit(limit)
            copies.close()
            if sender is not None:  # the last count, and the socket released on every path
                sender.close(0 if publisher is None else publisher.result.published)
        yield PartitionResult(result, copies.duplicates, copies.rejected, copies.filtered_out)

    return chosen.rdd.mapPartitionsWithIndex(publish_partition).collect()


# About 10 ms of reading copies (20 us each) between two turns of the loop.
_SKIPS_PER_TURN: Final = 500
# Copies are read on the publisher's loop (pika's ioloop, the confirm link, the
# pump), dozens of frames deeper than the service or the archiver reads the same
# event, and Python's JSON decoder counts those frames against its nesting: data
# nested 970 deep, which both of them accept, was a "nested too deeply" reject
# here. The partition's worker runs nothing else meanwhile.
_LOOP_FRAMES: Final = 100


class _Copies:
    """A partition's reading of its events' copies, in Python, with the service's
    validation: the first valid copy of each (source, id) is published, a valid
    later one is a duplicate and an invalid one a reject, written to ``rejects``
    (so a corrupt copy never stands in for a good one). A copy whose instant only
    Python can place (``deferred``) is placed here, in ``since``..``until``."""

    def __init__(
        self, rejects: Path | None, since: dt.datetime | None, until: dt.datetime | None
    ) -> None:
        self._path = rejects
        self._stream: IO[bytes] | None = None
        self._since = since
        self._until = until
        self.duplicates = 0
        self.rejected = 0
        self.filtered_out = 0

    def outgoing(self, rows: Iterable[Any]) -> Iterator[Outgoing | None]:
        """The events to publish; ``TURN`` after every ``_SKIPS_PER_TURN`` copies
        not published, so that a long run of them (rejects, duplicates, times
        outside the window) does not hold the publisher's loop past a heartbeat."""
        skipped = 0
        for row in rows:
            published = False
            for copy in row["copies"]:
                try:
                    event = records.from_line(copy["value"])
                except EventError as e:
                    self._reject(copy["file"], copy["value"], e.reason)
                else:
                    if copy["deferred"] and not self._in_window(event):
                        self.filtered_out += 1
                    elif published:
                        self.duplicates += 1
                    else:
                        published = True
                        yield _outgoing(event)
                        continue
                skipped += 1
                if skipped % _SKIPS_PER_TURN == 0:
                    yield TURN

    def _in_window(self, event: Event) -> bool:
        if self._since is None and self._until is None:
            return True
        when = records.instant(event)
        if when is None:
            return False
        return (self._since is None or when >= self._since) and (
            self._until is None or when < self._until
        )

    def _reject(self, file: str, line: str, reason: str) -> None:
        self.rejected += 1
        if self._path is None:
            return
        if self._stream is None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = self._path.open("wb")
        document = {"file": file, "line": line, "reason": reason}  # as Spark writes the rest
        # Escaped to ASCII: a line or reason may hold a lone surrogate (a JSON
        # "\ud800" the service refuses), which no UTF-8 encoder takes.
        self._stream.write(json.dumps(document).encode("ascii") + b"\n")

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


def _outgoing(event: Event) -> Outgoing:
    replayed = records.for_replay(event)
    headers, content_type = amqp_binding.to_amqp_headers(replayed)
    return Outgoing(
        key=(event.source, event.id),
        body=replayed.data or b"",
        headers=headers,
        content_type=content_type,
        archived=event.attributes.get(records.ARCHIVED),
    )


# --------------------------------------------------------------------- outputs


def _write_failed(folder: Path, results: list[PublishResult]) -> None:
    failed = [record for result in results for record in result.failed_records]
    if not failed:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "failed.jsonl").open("wb") as stream:
        for record in failed:
            stream.write(records.line(_as_event(record)) + b"\n")


def _as_event(record: Outgoing) -> Event:
    attributes = {name.removeprefix("ce-"): value for name, value in record.headers.items()}
    if record.content_type is not None:
        attributes["datacontenttype"] = record.content_type
    if record.archived is not None:  # so a retry places it in time as the original did
        attributes[records.ARCHIVED] = record.archived
    return Event(attributes, record.body)


def _write_counts(path: Path, counts: Counts) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {**asdict(counts), "events_per_second": counts.events_per_second}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
