"""Invariant 4 with the log output: a stdout pipe nobody reads stops nothing.

Broker I/O, acks and deliveries share the engine loop with the log writes.
A log shipper that stops reading fills the pipe in 64 KiB; a blocking write
would then stop the loop: no heartbeat (the broker closes the connection),
no ack of work already decided, no delivery.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, publish_events, wait_until
from tests.support.node import RabbitNode, free_port
from tests.support.process import DispatcherProcess

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

HEARTBEAT = 2.0


def test_a_stdout_nobody_reads_stops_neither_heartbeats_nor_acks(
    live_node: RabbitNode, make_subscriber, tmp_path: Path
) -> None:
    sub = make_subscriber()
    queue = broker.unique("unread")
    port = free_port()
    config = {
        "broker": {"url": live_node.url, "heartbeat": f"{HEARTBEAT:g}s", "connection_name": queue},
        "http": {"listen": f"127.0.0.1:{port}"},
        "shutdown": {"grace": "2s"},
        "bindings": [
            {"name": "b", "queue": queue, "subscriber": sub.url, "declare": {"durable": True}}
        ],
    }
    proc = DispatcherProcess(config, tmp_path, read=False)
    try:
        wait_until(lambda: _get(port, "/readyz")[0] == 200, 30, "the service to be ready")
        # Far more delivery lines than a pipe holds (64 KiB: a line is ~250 bytes).
        first = [f"u-{i}" for i in range(2_000)]
        publish_events(queue, first, url=live_node.url)
        wait_until(lambda: len(set(sub.ids())) == len(first), 60, "every event delivered")
        wait_until(lambda: live_node.unacked(queue) == 0, 30, "every delivery acked")
        assert live_node.ready_messages(queue) == 0
        # The pipe is still full. Heartbeats must flow past the broker's limit of
        # two missed ones: the passing time is the test here, not a synchronisation.
        time.sleep(4 * HEARTBEAT)
        publish(queue, headers=event_headers("after"), url=live_node.url)
        wait_until(lambda: "after" in sub.ids(), 30, "a delivery after the wait")
        wait_until(lambda: live_node.unacked(queue) == 0, 30, "its ack")
        metrics = _get(port, "/metrics")[1]
        assert _value(metrics, "dispatcher_broker_connected") == 1
        assert _sum(metrics, "dispatcher_reconnects_total") == 0  # never lost the connection
        assert live_node.connection_names().count(f"{queue}-consumer") == 1
    finally:
        proc.start_reading()
        assert proc.stop() == 0
    delivered = {
        line["ce_id"]
        for line in proc.lines
        if line.get("event") == "delivery" and line["outcome"] == "delivered"
    }
    assert delivered == {*first, "after"}  # held while unread, every line out at the end
    assert not proc.malformed
    broker.delete([queue], url=live_node.url)


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return getattr(e, "code", 0), ""


def _sum(metrics: str, name: str) -> float:
    return sum(
        float(line.split()[-1]) for line in metrics.splitlines() if line.startswith(name + "{")
    )


def _value(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")
