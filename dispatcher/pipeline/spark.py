"""The one place that starts Spark, so ``report`` and ``replay`` run unchanged
on ``local[*]`` (plain ``dispatcher report``) and on a cluster (``spark-submit``).

Under ``spark-submit`` the master and every ``--conf`` are already set, and
win: this module only fills in what is missing. Run directly, the master is
``local[*]``, the driver binds to loopback and Python workers use this
interpreter (else they would run whatever ``python3`` is on the PATH, which
may not have dispatcher installed); on a cluster, executors use what the
cluster configures, never the driver's path.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

from dispatcher.errors import BatchInputError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

INSTALL_ADVICE: Final = (
    "PySpark is not installed: install the pipeline extra (pip install 'dispatcher[pipeline]')"
)
# Only for a run without spark-submit (there, static settings are the user's).
_LOCAL_STATIC: Final = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The throughput collector: these are batch jobs, and the JVM's default on
    # a machine like ours (G1) made a 1M-line report 8% slower (farm-bench, 6
    # interleaved pairs, every pair slower). Spark puts the *default* options
    # before the user's own (spark-defaults.conf, --driver-java-options), which
    # setting extraJavaOptions here would replace.
    "spark.driver.defaultJavaOptions": "-XX:+UseParallelGC",
}
# Session settings, filled in wherever the user did not set them.
RUNTIME_DEFAULTS: Final = {
    # The tables these jobs aggregate into are small; 200 shuffle partitions
    # would be 200 tiny tasks per stage.
    "spark.sql.shuffle.partitions": "8",
    # Dates in the archive and report are UTC whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    # report's percentiles group in a hash map up to this many groups per task
    # before Spark sorts the rows instead; at Spark's 128, a day of minutes
    # sorts every time (1.8 s of a 1M-line report, measured). Memory is bounded
    # by the task's rows either way: each value sits in one group's buffer.
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "65536",
}


def require_pyspark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise BatchInputError(INSTALL_ADVICE) from None


def submitted() -> bool:
    """Whether spark-submit started this driver (it hands over its JVM gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


# The contexts ``session`` handed out and has not stopped: what a signal cancels.
# Never PySpark's own active context, which it registers before the JVM side
# exists (a cancel then raised and was never tried again: a signal during
# start-up was lost) and still names while ``stop`` runs (a cancel then
# printed the JVM's IllegalStateException). Under the lock, a cancel and a
# stop never overlap.
_LIVE: list[Any] = []
_LIVE_LOCK: Final = threading.Lock()


def cancel_all_jobs() -> None:
    """Cancel whatever Spark runs in this process, so the job's call returns (with an
    error): what the first SIGTERM/SIGINT does to ``report`` and ``replay``. Safe to
    call from any thread, at any time: before a session is up or after it stopped
    it cancels nothing (the caller calls again until the command returns)."""
    with _LIVE_LOCK:
        for context in _LIVE:
            context.cancelAllJobs()


@contextmanager
def _cancellable(context: Any) -> Iterator[None]:
    with _LIVE_LOCK:
        _LIVE.append(context)
    try:
        yield
    finally:
        with _LIVE_LOCK:
            _LIVE.remove(context)


@contextmanager
def session(app_name: str) -> Iterator[SparkSession]:
    """The active SparkSession, or a new one that is stopped again on exit."""
    require_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # a test's fixture, or an embedding application
        with _cancellable(active.sparkContext):
            yield active
        return
    builder = SparkSession.builder.appName(f"dispatcher-{app_name}")
    if not submitted():
        # Locally, workers run this interpreter; under spark-submit the cluster's
        # own setting (spark.pyspark.python, PYSPARK_PYTHON) decides.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.master("local[*]")
        for key, value in _LOCAL_STATIC.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    given = spark.sparkContext.getConf()
    for key, value in RUNTIME_DEFAULTS.items():
        if not given.contains(key):
            spark.conf.set(key, value)
    try:
        with _cancellable(spark.sparkContext):
            yield spark
    finally:
        spark.stop()
