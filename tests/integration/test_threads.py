"""Invariant 8 and issue 11: the thread count of `dispatcher run` does not grow with
parallelism, measured with that many deliveries actually in flight.

The subscriber is the bench's asyncio server (a subprocess), which holds every
request for a few seconds without a thread per request.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import broker
from tests.support.node import free_port
from tests.support.process import ROOT, DispatcherProcess

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

HOLD = 8.0  # seconds the subscriber keeps each request


@pytest.fixture
def slow_subscriber() -> Iterator[str]:
    port = free_port()
    script = ROOT / "tests/bench/fast_subscriber.py"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), "--delay", str(HOLD)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        broker.wait_until(lambda: _received(url) is not None, 15, "the subscriber to listen")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _received(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "stats", timeout=2) as response:
            return int(response.read().split()[0])
    except OSError:
        return None


def threads_with_in_flight(parallelism: int, subscriber: str, tmp_path: Path) -> int:
    queue = broker.unique("threads")
    tmp_path.mkdir()
    config = {
        "broker": {"url": broker.URL},
        "http": {"listen": f"127.0.0.1:{free_port()}"},
        "shutdown": {"grace": "1s"},
        "bindings": [
            {
                "name": "t",
                "queue": queue,
                "declare": {"durable": True},
                "subscriber": subscriber,
                "parallelism": parallelism,
                "delivery": {"timeout": "30s"},
            }
        ],
    }
    service = DispatcherProcess(config, tmp_path)
    try:
        service.wait_for("consumer attached")
        before = _received(subscriber) or 0
        broker.publish_events(queue, [f"{queue}-{i}" for i in range(parallelism)])
        broker.wait_until(
            lambda: (_received(subscriber) or 0) - before >= parallelism,
            60,
            f"{parallelism} requests in flight at the subscriber",
        )
        return _threads(service.popen.pid)
    finally:
        service.stop(timeout=30)
        with contextlib.suppress(Exception):
            broker.delete([queue])


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_thread_count_does_not_depend_on_parallelism(slow_subscriber, tmp_path):
    few = threads_with_in_flight(10, slow_subscriber, tmp_path / "few")
    many = threads_with_in_flight(2000, slow_subscriber, tmp_path / "many")
    assert many == few, f"{few} threads with 10 in flight, {many} with 2,000"
    assert many <= 8  # main, broker, engine, ops listener: no thread per delivery
