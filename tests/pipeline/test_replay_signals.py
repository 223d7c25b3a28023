"""The first SIGTERM/SIGINT stops ``replay`` whenever it comes (the second exits
at once: tests/unit/test_signals.py), and the stop says what was published.

Each case runs ``dispatcher replay`` as a process of its own, with a Spark
session of its own, to the shared broker's default exchange and a fresh queue.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import broker
from tests.support.archives import plain_archive
from tests.support.broker import wait_until
from tests.support.process import child_env

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 2000


def _start_replay(tmp_path: Path, queue: str, *options: str) -> subprocess.Popen[bytes]:
    plain_archive(tmp_path / "archive", EVENTS, "s")
    return subprocess.Popen(
        [sys.executable, "-m", "dispatcher", "replay", "--archive", str(tmp_path / "archive"),
         "--exchange", "", "--routing-key", queue, "--out", str(tmp_path / "out"), *options],
        cwd=ROOT,
        env=child_env({"RABBITMQ_URL": broker.URL}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip


def _terminated_once(
    process: subprocess.Popen[bytes], ready: Callable[[], object], what: str
) -> tuple[bytes, str]:
    """One SIGTERM once ``ready()``; the process's stdout and stderr when it has exited."""
    try:
        wait_until(ready, 120, what)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=240)
    finally:
        process.kill()
    return out, err.decode()


def _spark_jvm_started(pid: int) -> bool:
    """Spark's JVM is a child of the command: it is launched at the start of the
    session's creation, seconds before the session can run anything."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, _, rest = stat.partition(") ")
        if rest.split()[1] == str(pid) and name.endswith("(java"):
            return True
    return False


@pytest.fixture
def queue():
    name = broker.unique("replay-signal")
    with broker.channel() as ch:
        ch.queue_declare(name, durable=True)
    yield name
    broker.delete([name])


def test_a_signal_while_spark_starts_stops_it_before_anything_is_published(
    tmp_path: Path, queue: str
) -> None:
    """PySpark names its context as the active one before the JVM side exists: a
    cancel then raised, was never tried again, and the replay published every
    event and exited 0."""
    process = _start_replay(tmp_path, queue)
    out, text = _terminated_once(
        process,
        lambda: _spark_jvm_started(process.pid) or process.poll() is not None,
        "Spark's JVM to be launched",
    )
    assert process.returncode == 1, text[-3000:]
    assert "replay stopped by a signal before it finished: nothing was published" in text
    assert "could not ask" not in text and "Exception" not in text, text[-3000:]
    assert out == b""
    assert broker.queue_depth(queue) == 0


def test_a_signal_while_publishing_says_how_many_were_published(tmp_path: Path, queue: str) -> None:
    """The cancelled partitions' results never come back: the stop says how many
    at least went out (the partitions' confirmed counts as last reported), never
    more than did, and no second line says the stop failed."""
    process = _start_replay(tmp_path, queue, "--rate", "200")  # ten seconds of publishing
    _out, text = _terminated_once(
        process, lambda: broker.queue_depth(queue) >= 100, "publishing under way"
    )
    assert process.returncode == 1, text[-3000:]
    said = re.search(r"stopped by a signal before it finished: at least ([0-9,]+) events", text)
    assert said is not None, text[-3000:]
    published = broker.queue_depth(queue)
    assert 0 < int(said.group(1).replace(",", "")) <= published < EVENTS
    assert "could not ask" not in text and "Exception" not in text, text[-3000:]
