"""``dispatcher report``: delivery analytics over the service's JSON delivery logs.

Input is whatever collected the service's stdout: files, folders, globs, plain
or gzip (by the ``.gz`` suffix). A line may carry a prefix before its JSON
object, as ``kubectl logs --timestamps`` and container runtimes write them;
the record is the first JSON object on the line.

A line is a *delivery record* when that object has ``"event": "delivery"``
and well-typed fields (``DELIVERY_RULES``); every other line is skipped and
counted: as ``not_delivery`` (other log lines, console format, anything not
JSON) or ``malformed`` (says it is a delivery, but a field is missing or of
the wrong type). Nothing is parsed in Python: the rules are Spark SQL
expressions, so executors need no Python packages of ours and a million
lines cost seconds, not minutes.

Outputs in ``OUT`` (file names and columns are part of the user contract):
``summary.csv``, ``errors.csv``, ``attempts.csv``, the same tables as
``*.parquet`` folders, ``summary.md`` and ``report.png``, plus ``counts.json``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import operator
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from dispatcher.errors import BatchInputError
from dispatcher.pipeline import chart, inputs, progress
from dispatcher.pipeline import spark as spark_session

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

OUTCOMES: Final = ("delivered", "dead_lettered", "requeued", "rejected")
SUMMARY_COLUMNS: Final = (
    "binding",
    "ce_type",
    "delivered",
    "dead_lettered",
    "requeued",
    "rejected",
    "duplicates",
    "mean_attempts",
    "p50_ms",
    "p95_ms",
    "p99_ms",
)
ERRORS_COLUMNS: Final = ("binding", "status", "count")
ATTEMPTS_COLUMNS: Final = ("binding", "ce_type", "attempts", "count")
PERCENTILES: Final = (0.5, 0.95, 0.99)
STRING_FIELDS: Final = ("binding", "outcome", "ce_id", "ce_type")
DELIVERY_RULES: Final = """\
A delivery record is the first JSON object on a line with "event": "delivery" and:
binding, ce_id, ce_type: JSON strings (binding and ce_id not empty); outcome one of
delivered, dead_lettered, requeued, rejected; attempts an integer >= 0; status an
integer; duration_ms a finite number >= 0. Other fields are ignored."""


@dataclass(frozen=True, slots=True)
class Report:
    lines: int
    records: int
    not_delivery: int
    malformed: int
    summary: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    by_binding: list[dict[str, Any]]
    # Per binding (or the rest together) and minute, for the chart (``chart``).
    timeline: list[dict[str, Any]]

    @property
    def skipped(self) -> int:
        return self.not_delivery + self.malformed


# --------------------------------------------------------------------- command


def command(args: argparse.Namespace, _broker: object, _stop: threading.Event) -> str:
    """``dispatcher report`` inside the commands' frame (``dispatcher.cli``): the summary.
    A signal cancels the Spark job (the frame does); ``_stop`` is not polled here."""
    spark_session.require_pyspark()
    _refuse_out_inside_logs(args.out, args.logs)
    out = _output_folder(args.out)
    files = inputs.local_files(args.logs)
    inputs.check("--logs", files)
    with spark_session.session("report") as spark:
        paths = _input_paths(spark, args.logs)
        with progress.Progress().polling(progress.SparkBytesRead(spark)):
            try:
                report = build(spark, paths)
            except Exception:
                if not _stop.is_set():  # a signal's cancel is the frame's to say
                    inputs.refuse_broken_gzip("--logs", files)
                raise
            write(spark, report, out, args.logs)
    return (
        f"read {report.lines} lines: {report.records} delivery records, skipped "
        f"{report.skipped} ({report.not_delivery} not delivery records, "
        f"{report.malformed} malformed)\nwrote {out}/summary.csv, errors.csv, attempts.csv, "
        "summary.md, report.png and the Parquet tables"
    )


def _refuse_out_inside_logs(out: str, logs: Sequence[str]) -> None:
    """A second run would read the first one's output as logs (counted skipped)."""
    where = Path(out).resolve()
    for given in logs:
        if "://" in given and not given.startswith("file:"):
            continue  # another file system
        folder = Path(given.removeprefix("file://").removeprefix("file:"))
        while glob.has_magic(str(folder)):  # a glob reads below its fixed part
            folder = folder.parent
        if not folder.is_dir():
            continue
        folder = folder.resolve()
        if where == folder or folder in where.parents:
            raise BatchInputError(
                f"--out {out} is inside --logs {given}: the report would read its own "
                "output next time; use another --out"
            )


def _output_folder(out: str) -> Path:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BatchInputError(f"--out {out}: cannot create it: {e.strerror}") from None
    if not os.access(path, os.W_OK):
        raise BatchInputError(f"--out {out}: not writable")
    return path


def _input_paths(spark: SparkSession, given: Sequence[str]) -> list[str]:
    """Every given path that matches something; an error names the ones that match nothing."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    missing = []
    for text in given:
        path = jvm.org.apache.hadoop.fs.Path(text)
        matches = path.getFileSystem(hadoop_conf).globStatus(path)
        if matches is None or len(matches) == 0:
            missing.append(text)
    if missing:
        raise BatchInputError(f"--logs: nothing matches {', '.join(missing)}")
    return list(given)


# --------------------------------------------------------------------- the job


def build(spark: SparkSession, paths: Sequence[str]) -> Report:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    lines = spark.read.option("recursiveFileLookup", "true").text(list(paths))
    # Parsed once: the totals and every table come from this, not from the text.
    classified = (
        classify(lines)
        .select("kind", "binding", "outcome", "ce_id", "ce_type", "attempts", "status",
                "duration_ms", F.expr(_MINUTE).alias("minute"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )  # fmt: skip
    try:
        totals = classified.groupBy("kind").count().collect()
        by_kind = {row["kind"]: int(row["count"]) for row in totals}
        records = classified.where(F.col("kind") == "record").drop("kind")
        tables = grouped(spark, records)
        by_binding = tables["binding"]
        shown = chart.shown_bindings(by_binding)
        return Report(
            lines=sum(by_kind.values()),
            records=by_kind.get("record", 0),
            not_delivery=by_kind.get("not_delivery", 0),
            malformed=by_kind.get("malformed", 0),
            summary=_with_duplicates(tables["summary"], _rows(duplicates_table(records))),
            errors=tables["errors"],
            attempts=tables["attempts"],
            by_binding=by_binding,
            timeline=_timeline(records, tables["timeline"], shown),
        )
    finally:
        classified.unpersist()


def classify(lines: DataFrame) -> DataFrame:
    """Add ``kind`` (record, not_delivery, malformed) and the typed fields to each line."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("event", T.StringType()),
            *(T.StructField(name, T.StringType()) for name in STRING_FIELDS),
            T.StructField("attempts", T.LongType()),
            T.StructField("status", T.LongType()),
            T.StructField("duration_ms", T.DoubleType()),
            # Not a rule: a record without a readable one is left out of the
            # chart's time rows only.
            T.StructField("timestamp", T.StringType()),
        ]
    )
    text = F.expr("substring(value, instr(value, '{'))")
    parsed = lines.select(text.alias("json")).select("json", F.from_json("json", schema).alias("r"))
    parsed = parsed.select("json", "r.*")
    is_delivery = F.col("event").eqNullSafe("delivery") & _is_json_string(F.col("json"), "event")
    kind = (
        F.when(~is_delivery, "not_delivery").when(_well_formed(), "record").otherwise("malformed")
    )
    return parsed.withColumn("kind", kind)


def _is_json_string(raw: Column, name: str) -> Column:
    # from_json renders a number or object given for a string field as its
    # JSON text; the rules want an actual JSON string.
    return raw.rlike(f'"{name}"\\s*:\\s*"')


def _well_formed() -> Column:
    from pyspark.sql import functions as F

    duration = F.col("duration_ms")
    checks = [_is_json_string(F.col("json"), name) for name in STRING_FIELDS]
    checks += [
        F.col("binding") != "",
        F.col("ce_id") != "",
        F.col("outcome").isin(*OUTCOMES),
        F.col("attempts") >= 0,
        F.col("status").isNotNull(),
        duration >= 0,
        ~F.isnan(duration),
        duration < float("inf"),
    ]
    combined = checks[0]
    for check in checks[1:]:
        combined = combined & check
    return F.coalesce(combined, F.lit(False))


# Every table but the duplicates is a grouping of the same records. Spark
# computes them in one aggregation (GROUPING SETS): one scan, one plan, one
# code generation, where one query per table paid each of those again (about
# 6 s of the report's 1M-line run, measured). Columns a grouping does not use
# are NULL in its rows; ``grouping_id`` tells the groupings apart.
#
# Percentiles are exact (Spark's ``percentile``, not ``percentile_approx``):
# linear interpolation between the two nearest ranks, as numpy's default and a
# spreadsheet's PERCENTILE.INC, rounded half up to 3 places by Spark, so a
# spreadsheet over the same lines agrees to the digit.
_KEYS: Final = ("binding", "ce_type", "minute", "status", "attempts")
GROUPINGS: Final = {
    "summary": ("binding", "ce_type"),
    "binding": ("binding",),
    "timeline": ("binding", "minute"),
    "errors": ("binding", "status"),
    "attempts": ("binding", "ce_type", "attempts"),
}
# Groupings whose rows carry latency percentiles (the others only count).
_TIMED: Final = ("summary", "binding", "timeline")
# Minute of the record's timestamp, in epoch seconds (UTC); NULL when unreadable.
_MINUTE: Final = "floor(cast(to_timestamp(timestamp) AS double) / 60) * 60"
_PERCENTILE_COLUMNS: Final = tuple(f"p{round(q * 100)}_ms" for q in PERCENTILES)
_GROUPED_SQL: Final = """
SELECT grouping_id({keys}) AS grouping, {keys}, count(1) AS count, {outcomes},
  round(avg(attempts), 4) AS mean_attempts,
  transform(percentile(IF({timed}, duration_ms, NULL), array({percentiles})), p -> round(p, 3))
    AS p
FROM {{records}}
GROUP BY GROUPING SETS ({sets})
"""


def grouped(spark: SparkSession, records: DataFrame) -> dict[str, list[dict[str, Any]]]:
    """Every grouping of ``GROUPINGS``: its rows in the order its table is written,
    each with its keys, ``count``, the outcome counts and, where timed, the
    percentiles (``p50_ms``...), rounded as the tables write them."""
    rows = spark.sql(_grouped_sql(), records=records).collect()
    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in GROUPINGS}
    names = {_grouping_id(keys): name for name, keys in GROUPINGS.items()}
    for row in rows:
        name = names[row["grouping"]]
        if name == "timeline" and row["minute"] is None:
            continue  # no readable timestamp: in every table but the chart's time rows
        entry = {key: row[key] for key in (*GROUPINGS[name], "count", *OUTCOMES)}
        if name == "summary":
            entry["mean_attempts"] = row["mean_attempts"]
        if name in _TIMED:
            entry.update(zip(_PERCENTILE_COLUMNS, row["p"], strict=True))
        tables[name].append(entry)
    tables["errors"] = [r for r in tables["errors"] if not 200 <= r["status"] <= 299]
    tables["errors"].sort(key=lambda r: (r["binding"], -r["count"], r["status"]))
    for name in ("summary", "binding", "timeline", "attempts"):
        tables[name].sort(key=operator.itemgetter(*GROUPINGS[name]))
    return tables


def _grouped_sql() -> str:
    timed = " OR ".join(f"grouping_id({', '.join(_KEYS)}) = {_grouping_id(GROUPINGS[n])}"
                        for n in _TIMED)  # fmt: skip
    return _GROUPED_SQL.format(
        keys=", ".join(_KEYS),
        outcomes=", ".join(f"count_if(outcome = '{o}') AS {o}" for o in OUTCOMES),
        timed=timed,
        percentiles=", ".join(str(q) for q in PERCENTILES),
        sets=", ".join(f"({', '.join(keys)})" for keys in GROUPINGS.values()),
    )


def _grouping_id(keys: Sequence[str]) -> int:
    """Spark's ``grouping_id`` of a grouping: a bit per key column it leaves out,
    the first column the most significant."""
    return sum(1 << (len(_KEYS) - 1 - i) for i, key in enumerate(_KEYS) if key not in keys)


def duplicates_table(records: DataFrame) -> DataFrame:
    """Per binding and type, the ``ce_id``s delivered more than once."""
    from pyspark.sql import functions as F

    keys = ["binding", "ce_type"]
    return (
        records.where(F.col("outcome") == "delivered")
        .groupBy(*keys, "ce_id")
        .count()
        .where(F.col("count") > 1)
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("duplicates"))
    )


def _with_duplicates(
    summary: list[dict[str, Any]], duplicates: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    counted = {(r["binding"], r["ce_type"]): r["duplicates"] for r in duplicates}
    for row in summary:
        row["duplicates"] = counted.get((row["binding"], row["ce_type"]), 0)
    return summary


def _timeline(
    records: DataFrame, per_binding: list[dict[str, Any]], shown: Sequence[str]
) -> list[dict[str, Any]]:
    """The chart's rows over time: per group (a binding of ``shown``, else
    ``chart.OTHERS``) and minute (epoch seconds, UTC), outcome counts and p95.
    The rest's p95 is over their records together, so it is a query of its own."""
    rows = [
        {"group": r["binding"], "minute": r["minute"], **{o: r[o] for o in OUTCOMES},
         "p95_ms": r["p95_ms"]}
        for r in per_binding
        if r["binding"] in shown
    ]  # fmt: skip
    if any(r["binding"] not in shown for r in per_binding):
        rows += _rows(rest_timeline_table(records, shown))
    return sorted(rows, key=lambda r: (r["group"], r["minute"]))


def rest_timeline_table(records: DataFrame, shown: Sequence[str]) -> DataFrame:
    """Per minute, the bindings not in ``shown`` together, as ``chart.OTHERS``."""
    from pyspark.sql import functions as F

    return (
        records.where(~F.col("binding").isin(*shown))
        .where(F.col("minute").isNotNull())
        .groupBy("minute")
        .agg(
            *(F.count_if(F.col("outcome") == o).alias(o) for o in OUTCOMES),
            F.round(F.percentile("duration_ms", 0.95), 3).alias("p95_ms"),
        )
        .select(F.lit(chart.OTHERS).alias("group"), "*")
    )


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


# --------------------------------------------------------------------- outputs


def write(spark: SparkSession, report: Report, out: Path, inputs: Sequence[str]) -> None:
    tables = {
        "summary": (SUMMARY_COLUMNS, report.summary),
        "errors": (ERRORS_COLUMNS, report.errors),
        "attempts": (ATTEMPTS_COLUMNS, report.attempts),
    }
    for name, (columns, rows) in tables.items():
        _write_csv(out / f"{name}.csv", columns, rows)
        _write_parquet(spark, out / f"{name}.parquet", columns, rows)
    counts = {
        "lines": report.lines,
        "records": report.records,
        "skipped": report.skipped,
        "not_delivery": report.not_delivery,
        "malformed": report.malformed,
    }
    _atomic_write(out / "counts.json", (json.dumps(counts, indent=2) + "\n").encode())
    _atomic_write(out / "summary.md", markdown(report, inputs).encode())
    _atomic_write(out / "report.png", chart.render(report.by_binding, report.timeline))


def _write_csv(path: Path, columns: Sequence[str], rows: list[dict[str, Any]]) -> None:
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(columns)
    writer.writerows([[row[c] for c in columns] for row in rows])
    _atomic_write(path, text.getvalue().encode())


def _write_parquet(
    spark: SparkSession, path: Path, columns: Sequence[str], rows: list[dict[str, Any]]
) -> None:
    from pyspark.sql import types as T

    types = {
        "binding": T.StringType(),
        "ce_type": T.StringType(),
        "mean_attempts": T.DoubleType(),
        "p50_ms": T.DoubleType(),
        "p95_ms": T.DoubleType(),
        "p99_ms": T.DoubleType(),
    }
    schema = T.StructType([T.StructField(c, types.get(c, T.LongType())) for c in columns])
    frame = spark.createDataFrame([tuple(row[c] for c in columns) for row in rows], schema)
    # One file: these tables have a row per binding and type, not per event.
    frame.coalesce(1).write.mode("overwrite").parquet(str(path))


def _atomic_write(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    temporary.replace(path)


def markdown(report: Report, inputs: Sequence[str]) -> str:
    parts = [
        "# Delivery report\n",
        f"Input: {', '.join(f'`{p}`' for p in inputs)}\n",
        f"- lines read: {report.lines}",
        f"- delivery records: {report.records}",
        f"- skipped: {report.skipped} ({report.not_delivery} not delivery records, "
        f"{report.malformed} malformed)\n",
        "## Per binding and event type\n",
        _md_table(SUMMARY_COLUMNS, report.summary),
        "\n## Top error codes per binding\n",
        "Final statuses that are not 2xx (-1: timeout or transport error).\n",
        _md_table(ERRORS_COLUMNS, _top_errors(report.errors, 5)),
        "\n## Attempts\n",
        _md_table(ATTEMPTS_COLUMNS, report.attempts),
        "\n![latency and outcomes per binding](report.png)\n",
    ]
    return "\n".join(parts)


def _top_errors(rows: list[dict[str, Any]], per_binding: int) -> list[dict[str, Any]]:
    shown: dict[str, int] = {}
    top = []
    for row in rows:  # already ordered by binding, count descending
        if shown.get(row["binding"], 0) < per_binding:
            top.append(row)
            shown[row["binding"]] = shown.get(row["binding"], 0) + 1
    return top


def _md_table(columns: Sequence[str], rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_md_cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")
