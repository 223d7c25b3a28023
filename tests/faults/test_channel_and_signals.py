"""Channel-level closes with the connection alive, and SIGTERM in bad weather."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.broker import event_headers, publish, publish_events, unique, wait_until
from tests.support.node import RabbitNode
from tests.support.process import DispatcherProcess
from tests.support.subscriber import Received, Reply

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]

CONSUMER_TIMEOUT_MS = 3000


@pytest.fixture(scope="module")
def short_timeout_node() -> Iterator[RabbitNode]:
    """consumer_timeout is per node in 3.10 and enforced on the channel tick."""
    node = RabbitNode(
        advanced_config=(
            f"[{{rabbit, [{{consumer_timeout, {CONSUMER_TIMEOUT_MS}}},"
            " {channel_tick_interval, 1000}]}]."
        )
    ).start()
    yield node
    node.shutdown()


def test_consumer_timeout_closes_the_channel_and_nothing_is_acked_in_anothers_place(
    short_timeout_node: RabbitNode, make_subscriber, run_service, capsys
):
    """Failure 2 and the tag-reuse fact: the broker closes the channel (406), the
    connection stays; after the rebuild no old tag may ack a new message."""

    def slow_first(request: Received, _i: int) -> Reply:
        slow = request.headers.get("ce-id") == "ct-slow"
        return Reply(200, delay=10.0 if slow else 0.05)

    sub = make_subscriber(slow_first)
    svc = run_service(
        sub.url, url=short_timeout_node.url, parallelism=4, delivery={"timeout": "30s"}
    )
    ids = ["ct-slow", *[f"ct-{i:02d}" for i in range(19)]]
    publish_events(svc.queue, ids, url=short_timeout_node.url)
    svc.wait_events("delivered", 20, timeout=90)
    assert sorted(sub.ids()) == sorted(ids)  # every id, each exactly once
    assert svc.value("dispatcher_reconnects_total", reason="channel_closed") >= 1
    connection_closes = sum(
        svc.value("dispatcher_reconnects_total", reason=r)
        for r in ("connection_lost", "closed_by_broker", "heartbeat_timeout")
    )
    assert connection_closes == 0
    wait_until(svc.service.ready, 20, "a consumer again")
    wait_until(lambda: short_timeout_node.ready_messages(svc.queue) == 0, 20, "the queue to drain")
    assert short_timeout_node.unacked(svc.queue) == 0
    # The slow delivery's verdict belonged to the closed channel: dropped and
    # counted, never sent on the new one. Sent anyway, tag reuse would either
    # ack another message or draw "406 unknown delivery tag" (review finding:
    # without these two checks a cross-generation ack could pass unnoticed).
    assert svc.value("dispatcher_stale_acks_total", binding="b") >= 1
    assert "unknown delivery tag" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- SIGTERM


def sigterm_config(node: RabbitNode, subscriber_url: str, queue: str, grace: str) -> dict:
    return {
        "broker": {"url": node.url, "reconnect": {"initial_delay": "50ms", "max_delay": "1s"}},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": grace},
        "bindings": [
            {
                "name": "sig",
                "queue": queue,
                "subscriber": subscriber_url,
                "declare": {"durable": True},
                "delivery": {"timeout": "120s"},
            }
        ],
    }


@pytest.fixture
def holding(live_node: RabbitNode, make_subscriber, tmp_path: Path) -> Iterator:
    """A `dispatcher run` process whose hung subscriber holds one message in flight."""
    made: list[DispatcherProcess] = []

    def make(grace: str) -> tuple[DispatcherProcess, str]:
        sub = make_subscriber(lambda _r, _i: Reply(hang=True))
        queue = unique("sig")
        proc = DispatcherProcess(sigterm_config(live_node, sub.url, queue, grace), tmp_path)
        made.append(proc)
        proc.wait_for("consumer attached")
        publish(queue, headers=event_headers("held-1"), url=live_node.url)
        sub.wait_for(1)
        return proc, queue

    yield make
    for proc in made:
        proc.kill()


def still_queued(node: RabbitNode, queue: str) -> None:
    """Not acked and not dead-lettered: the broker has the message back."""
    wait_until(lambda: node.ready_messages(queue) == 1, 10, "the message back in the queue")


def test_sigterm_with_a_hung_subscriber(live_node: RabbitNode, holding):
    proc, queue = holding("2s")
    started = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(timeout=20) == 0
    assert time.monotonic() - started < 2 + 7  # grace + the close bounds
    still_queued(live_node, queue)


def test_sigterm_with_the_broker_down(live_node: RabbitNode, holding):
    proc, queue = holding("2s")
    live_node.stop_app()
    started = time.monotonic()
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(timeout=20) == 0
    assert time.monotonic() - started < 2 + 7
    live_node.start_app()
    still_queued(live_node, queue)


def test_a_second_signal_exits_at_once(live_node: RabbitNode, holding):
    proc, queue = holding("60s")
    proc.popen.send_signal(signal.SIGINT)
    proc.wait_for("shutdown started")
    # During the grace period the pod is taken out of its Service's endpoints.
    status, _type, body = proc.get("/readyz")
    assert (status, json.loads(body)["reason"]) == (503, "shutting down")
    started = time.monotonic()
    proc.popen.send_signal(signal.SIGINT)
    assert proc.popen.wait(timeout=10) == 1
    assert time.monotonic() - started < 2
    still_queued(live_node, queue)
