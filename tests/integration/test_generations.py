"""Invariant 2: a verdict belongs to its channel generation; stale ones are dropped and counted."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker


def unacked(queue: str) -> int:
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "messages_unacknowledged"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == queue:
            return int(parts[1])
    raise AssertionError(f"queue {queue} not listed")


def test_ack_for_a_dead_channel_is_dropped_not_sent_on_the_new_one(make_subscriber, run_service):
    sub = make_subscriber(lambda _r, i: Reply(200, delay=1.0) if i == 0 else Reply(200))
    svc = run_service(sub.url)
    supervisor = svc.service.supervisor
    publish(svc.queue, headers=event_headers("g-1"))
    sub.wait_for(1)
    generation = supervisor._bindings["b"].generation
    # Close the channel under the in-flight delivery, as a broker-side channel error would.
    with supervisor._lock:
        connection = supervisor._connection
    channel = supervisor._bindings["b"].channel
    supervisor._call_soon(connection, channel.close)
    wait_until(
        lambda: supervisor._bindings["b"].generation > generation and supervisor.ready(),
        message="a new channel generation with a consumer",
    )
    wait_until(
        lambda: svc.value("dispatcher_stale_acks_total", binding="b") == 1,
        message="the old generation's ack to be counted as stale",
    )
    # The broker redelivered it on the new channel; the first attempt was still in
    # flight, so the redelivery waited for it and was acked without a second request.
    wait_until(
        lambda: svc.value("dispatcher_duplicates_suppressed_total", binding="b") == 1,
        message="the redelivery to be suppressed",
    )
    svc.wait_events("delivered", 1)
    assert sub.ids() == ["g-1"]
    assert svc.value("dispatcher_reconnects_total", reason="channel_closed") == 1
    # Had the stale ack been sent on the new channel, tag 1 would have been acked
    # twice and the broker would have closed the channel again (406).
    assert supervisor._bindings["b"].channel.is_open
    assert queue_depth(svc.queue) == 0
    assert unacked(svc.queue) == 0
