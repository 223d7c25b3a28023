"""``dispatcher.pipeline.spark.session`` run the way a user runs a command locally:
a fresh process whose JVM the session starts (the suite's own session is not
used, so this starts a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helm import ROOT

pytestmark = pytest.mark.spark

JVM_OPTIONS = """
from dispatcher.pipeline import spark
with spark.session("test") as session:
    runtime = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    print(" ".join(runtime.getInputArguments()))
"""


def test_the_local_jvm_gets_our_collector_and_keeps_the_user_s_java_options(
    tmp_path: Path,
) -> None:
    # Options from spark-defaults.conf and from PYSPARK_SUBMIT_ARGS both reach
    # the JVM beside ours: ours are defaults, never a replacement of the user's.
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.driver.extraJavaOptions -Dfrom.defaults=1\n"
    )
    env = {
        **os.environ,
        "SPARK_CONF_DIR": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    for submit_args, user_option in (
        (None, "-Dfrom.defaults=1"),
        ("--driver-java-options -Dfrom.submit=1 pyspark-shell", "-Dfrom.submit=1"),
    ):
        if submit_args is None:
            env.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            env["PYSPARK_SUBMIT_ARGS"] = submit_args
        done = subprocess.run(
            [sys.executable, "-c", JVM_OPTIONS],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        options = done.stdout.split()
        assert "-XX:+UseParallelGC" in options and user_option in options, options
