"""Replay's read and selection, in Spark: the archive's lines as far as the
selection and the dedupe need them, and the selected events' copies gathered
by (source, id) in the one shuffle that feeds the publishing partitions.

Every ``*.jsonl`` and ``*.jsonl.gz`` below ``--archive`` (hidden files, such as
an interrupted archiver's temp files, are skipped) is read with Spark's JSON
reader, taking only source, id, type and the instant (``read``); a line it
finds no source or id in is read by Python, those lines alone
(``read_in_python``): a reject with the service's reason, or an event after
all (Jackson refuses some JSON Python reads, such as a number of over 1,000
digits). ``--type``, ``--source``, ``--since`` (inclusive) and ``--until``
(exclusive) are compared as instants (``records.instant``'s rule, in SQL).
No Python reads a line whole here: that happens only where it is published
(``replay_publish``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from dispatcher.errors import EventError
from dispatcher.pipeline import records

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
class Selection:
    """What ``--type``, ``--source``, ``--since`` and ``--until`` select."""

    type: str | None = None
    source: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


@dataclass(slots=True)
class Selected:
    """What ``select`` knows before anything is published, and the events to publish."""

    lines: int = 0
    malformed: int = 0
    filtered_out: int = 0
    partitions: int = 0
    chosen: Any = None  # a DataFrame: a row per (source, id), its copies sorted


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


def select(
    spark: SparkSession,
    lines: DataFrame,
    by_python: DataFrame,
    selection: Selection,
    partitions: int | None,
    rejects: Path,
) -> Selected:
    """The counts known before publishing, the rejects of lines Spark could not
    read written to ``rejects``, and the selected events (a row per (source, id)
    with every copy) over how many partitions (``partitions``, else Spark's
    default parallelism)."""
    from pyspark.sql import functions as F

    counts = Selected()
    readable = F.col("readable")
    selected = _condition(selection)
    totals = lines.agg(
        F.count(F.lit(1)).alias("lines"),
        F.sum(F.when(readable & ~selected, 1).otherwise(0)).alias("filtered_out"),
    ).first()
    assert totals is not None
    counts.lines = int(totals["lines"])
    counts.filtered_out = int(totals["filtered_out"] or 0)
    refused = F.col("reason").isNotNull()
    small = by_python.agg(
        F.sum(F.when(refused, 1).otherwise(0)).alias("malformed"),
        F.sum(F.when(~refused & ~selected, 1).otherwise(0)).alias("filtered_out"),
    ).first()
    assert small is not None
    counts.malformed = int(small["malformed"] or 0)
    counts.filtered_out += int(small["filtered_out"] or 0)
    by_python.where(refused).select("file", F.col("value").alias("line"), "reason").write.mode(
        "overwrite"
    ).json(str(rejects))
    events = lines.where(readable & selected).select(*_EVENT_COLUMNS)
    events = events.unionByName(by_python.where(~refused & selected).select(*_EVENT_COLUMNS))
    counts.partitions = partitions or spark.sparkContext.defaultParallelism
    # The one shuffle: by (source, id) into the publishing partitions, so that the
    # grouping of an event's copies needs no other (the plan has one Exchange).
    chosen = (
        events.repartition(counts.partitions, "source", "id")
        .groupBy("source", "id")
        .agg(
            F.min("instant_us").alias("instant_us"),
            F.sort_array(F.collect_list(F.struct("file", "value", "deferred"))).alias("copies"),
        )
        .sortWithinPartitions("instant_us", "source", "id")
    )
    counts.chosen = chosen
    return counts


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
    instant = None if when is None else epoch_micros(when)
    return file, value, event.source, event.id, event.type, instant, None


def _condition(options: Selection) -> Any:
    from pyspark.sql import functions as F

    condition = F.lit(True)
    if options.type is not None:
        condition = condition & (F.col("type") == options.type)
    if options.source is not None:
        condition = condition & (F.col("source") == options.source)
    # An event with no instant at all cannot be placed in a time range; one that
    # Python places is in the selection until Python has (``replay_publish.Copies``).
    since, until = epoch_micros(options.since), epoch_micros(options.until)
    if since is not None:
        condition = condition & (F.col("deferred") | (F.col("instant_us") >= since))
    if until is not None:
        condition = condition & (F.col("deferred") | (F.col("instant_us") < until))
    return F.coalesce(condition, F.lit(False))


def epoch_micros(when: dt.datetime | None) -> int | None:
    if when is None:
        return None
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
