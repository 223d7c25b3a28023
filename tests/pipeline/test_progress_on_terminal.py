"""``report`` and ``replay`` on a terminal: a progress line while Spark works,
erased before the summary (stdout as a pipe or file is covered by the other
tests, which read the summary alone)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dispatcher.pipeline.progress import ERASE
from tests.support import broker, delivery_logs
from tests.support.archives import plain_archive
from tests.support.process import child_env
from tests.support.terminal import run_on_terminal

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def dispatcher_on_terminal(tmp_path: Path, *args: str) -> tuple[str, str]:
    code, screen = run_on_terminal(
        [sys.executable, "-m", "dispatcher", *args],
        cwd=ROOT,
        env=child_env({"RABBITMQ_URL": broker.URL}),
        stderr=tmp_path / "stderr",
        timeout=180,
    )
    assert code == 0, (tmp_path / "stderr").read_text()[-3000:]
    progress, _, summary = screen.rpartition(ERASE)
    return progress, summary


def test_report_shows_the_megabytes_spark_has_read(tmp_path: Path) -> None:
    delivery_logs.write_logs(tmp_path / "logs", 20_000, files=2)
    progress, summary = dispatcher_on_terminal(
        tmp_path, "report", "--logs", str(tmp_path / "logs"), "--out", str(tmp_path / "out")
    )
    assert re.search(r"[0-9,]+ MB read, [0-9,]+ MB/s, 0:[0-9]{2}", progress), progress
    assert summary.startswith("read 2"), summary  # the summary line, on a clean line


@pytest.mark.broker
def test_replay_shows_the_events_its_partitions_have_published(tmp_path: Path) -> None:
    plain_archive(tmp_path / "archive", 2000, "p")
    queue = broker.unique("progress")
    with broker.channel() as ch:
        ch.queue_declare(queue, durable=True)
    try:
        # --rate spreads the publishing over about two seconds: several redraws.
        progress, summary = dispatcher_on_terminal(
            tmp_path, "replay", "--archive", str(tmp_path / "archive"), "--exchange", "",
            "--routing-key", queue, "--rate", "1000", "--out", str(tmp_path / "out"),
        )  # fmt: skip
        assert broker.queue_depth(queue) == 2000
    finally:
        broker.delete([queue])
    published = re.findall(r"([0-9,]+) events published, [0-9,]+ events/s", progress)
    assert published, progress
    counts = [int(n.replace(",", "")) for n in published]
    assert counts == sorted(counts) and 0 < counts[-1] <= 2000  # it grows, never past the total
    assert summary.startswith("replayed to exchange '': published 2000"), summary
