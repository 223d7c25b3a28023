"""The cluster path, for real: a Spark standalone master and two workers on
loopback, ``report`` and ``replay`` submitted with ``spark-submit`` through the
same launcher users run: the report's output compared with the local run's,
the replay's counts and the queue it filled checked."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest

from dispatcher.event.cloudevent import Event
from dispatcher.pipeline import records
from tests.support import broker, delivery_logs

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_env() -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOG_DIR": os.environ.get("TMPDIR", "/tmp"),
    }


def wait_for_http(url: str, what: str, process: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return str(response.read().decode())
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{what} did not answer at {url} within {timeout}s")


@dataclass(frozen=True)
class Cluster:
    url: str  # spark://127.0.0.1:PORT
    status_url: str  # the master's JSON status

    def completed_apps(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            apps: list[dict[str, Any]] = json.load(response)["completedapps"]
            return apps


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master with two workers (one core each) registered."""
    logs = tmp_path_factory.mktemp("cluster-logs")
    port, master_ui = free_port(), free_port()
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    started: list[subprocess.Popen[bytes]] = []
    try:
        with (logs / "master.log").open("wb") as out:
            master = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                 "--port", str(port), "--webui-port", str(master_ui)],
                env=spark_env(), stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        started.append(master)
        url = f"spark://127.0.0.1:{port}"
        wait_for_http(f"http://127.0.0.1:{master_ui}/json/", "master", master, 60)
        for n in range(WORKERS):
            with (logs / f"worker-{n}.log").open("wb") as out:
                worker = subprocess.Popen(
                    [spark_class, "org.apache.spark.deploy.worker.Worker", url,
                     "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                     "--webui-port", str(free_port())],
                    env=spark_env(), stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            started.append(worker)
        deadline = time.monotonic() + 60
        while f'"aliveworkers" : {WORKERS}' not in wait_for_http(
            f"http://127.0.0.1:{master_ui}/json/", "master", master, 10
        ):
            assert time.monotonic() < deadline, "the workers never registered with the master"
            for process in started:
                assert process.poll() is None, f"a cluster process exited: {process.returncode}"
            time.sleep(0.3)
        yield Cluster(url, f"http://127.0.0.1:{master_ui}/json/")
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def test_report_under_spark_submit_on_a_cluster_equals_the_local_run(
    spark: Any, cluster: Cluster, tmp_path: Path, capsys: Any
) -> None:
    from dispatcher import cli

    logs = tmp_path / "logs"
    delivery_logs.write_logs(logs, 3000, files=3)
    assert cli.main(["report", "--logs", str(logs), "--out", str(tmp_path / "local")]) == 0
    capsys.readouterr()

    submitted = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url,
         "--conf", "spark.ui.enabled=false",
         str(ROOT / "cmd" / "dispatcher.py"),
         "report", "--logs", str(logs), "--out", str(tmp_path / "cluster")],
        check=False, env=spark_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip

    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "delivery records" in submitted.stdout
    # It ran on the cluster (the master saw it through), not on a local master.
    finished = [app for app in cluster.completed_apps() if app["name"] == "dispatcher-report"]
    assert len(finished) == 1 and finished[0]["state"] == "FINISHED", finished
    for name in ("summary.csv", "errors.csv", "attempts.csv", "counts.json"):
        local = (tmp_path / "local" / name).read_text()
        assert (tmp_path / "cluster" / name).read_text() == local, name
    assert (tmp_path / "cluster" / "report.png").stat().st_size > 0


@pytest.mark.broker
def test_replay_under_spark_submit_publishes_from_both_workers_once_each(
    cluster: Cluster, tmp_path: Path
) -> None:
    made = [
        Event(
            {"specversion": "1.0", "id": f"c-{i}", "source": "/cluster", "type": "dev.t"},
            b'{"n":%d}' % i,
        )
        for i in range(2000)
    ]
    archived = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    day = tmp_path / "archive" / "date=2026-11-20"
    day.mkdir(parents=True)
    lines = [records.to_line(event, archived) for event in made]
    for n in range(4):  # four files, the first 100 events archived twice, one junk line
        part = lines[n::4] + (lines[:100] if n == 3 else []) + ([b"{junk"] if n == 0 else [])
        (day / f"part-{n}.jsonl").write_bytes(b"\n".join(part) + b"\n")
    queue = broker.unique("cluster-replay")
    with broker.channel() as ch:
        ch.queue_declare(queue, durable=True)
    try:
        submitted = subprocess.run(
            [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.url,
             "--conf", "spark.ui.enabled=false",
             str(ROOT / "cmd" / "dispatcher.py"),
             "replay", "--archive", str(tmp_path / "archive"), "--exchange", "",
             "--routing-key", queue, "--partitions", str(WORKERS),
             "--out", str(tmp_path / "out")],
            check=False, env={**spark_env(), "RABBITMQ_URL": broker.URL},
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        counts = json.loads((tmp_path / "out" / "counts.json").read_text())
        assert (counts["published"], counts["skipped_duplicate"], counts["malformed"]) == (
            2000,
            100,
            1,
        )
        # One connection per partition, never one per record.
        assert counts["partitions"] == counts["connections"] == WORKERS
        ids = sorted(p.headers["ce-id"] for p, _body in broker.get_all(queue))
        assert ids == sorted(event.id for event in made)
    finally:
        broker.delete([queue])
    finished = [app for app in cluster.completed_apps() if app["name"] == "dispatcher-replay"]
    assert len(finished) == 1 and finished[0]["state"] == "FINISHED", finished
    assert finished[0]["cores"] == WORKERS  # an executor on each worker
