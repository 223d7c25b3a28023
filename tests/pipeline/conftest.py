"""One SparkSession for every Spark test (``local[2]``): starting one costs seconds.

The commands under test find it with ``SparkSession.getActiveSession()`` and
leave it running, exactly as they would leave an embedding application's.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.java import ensure_java


@pytest.fixture(scope="session", autouse=True)
def java() -> None:
    """Spark's JVM: the machine's, else one fetched into .cache/ (tests/support/java.py)."""
    ensure_java()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dispatcher.pipeline.spark import RUNTIME_DEFAULTS

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("dispatcher-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    # The commands' own session settings, so the tests run the plans users get
    # (a command leaves an active session's settings alone); fewer shuffle
    # partitions only for speed.
    for key, value in {**RUNTIME_DEFAULTS, "spark.sql.shuffle.partitions": "4"}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
