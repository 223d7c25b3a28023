"""Invariant 2: an action belongs to the channel its message arrived on; stale ones
are dropped and counted."""

from __future__ import annotations

import subprocess
import threading

import pytest

from tests.support.broker import event_headers, publish, publish_events, queue_depth, wait_until
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
    generation = supervisor.generation("b")
    # Close the channel under the in-flight delivery, as a broker-side channel error would.
    assert supervisor.close_channel("b")
    wait_until(
        lambda: supervisor.generation("b") > generation and svc.service.ready(),
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
    assert supervisor.channel_ready("b")
    assert queue_depth(svc.queue) == 0
    assert unacked(svc.queue) == 0


def test_each_delivery_is_settled_once_and_never_with_multiple(make_subscriber, run_service):
    """Invariant 3. Deliveries finish out of order here, so a `multiple` ack (or a
    second ack) would settle tags still in flight, and their own acks would then
    draw 406 'unknown delivery tag', closing the channel."""
    sub = make_subscriber(lambda _r, i: Reply(200, delay=0.3 if i % 2 == 0 else 0.02))
    svc = run_service(sub.url, parallelism=4)
    first_generation = svc.service.supervisor.generation("b")
    ids = [f"m-{i:02d}" for i in range(16)]
    publish_events(svc.queue, ids)
    svc.wait_events("delivered", 16)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue to drain")
    assert unacked(svc.queue) == 0
    assert sorted(sub.ids()) == ids
    assert svc.value("dispatcher_reconnects_total", reason="channel_closed") == 0
    assert svc.service.supervisor.generation("b") == first_generation


def test_requeues_are_single_settlements_too(make_subscriber, run_service):
    """Invariant 3 on the nack path: with the dead-letter sink down every 400 is
    requeued, out of order with the acks around it. A `multiple` nack would
    requeue deliveries still in flight, and their own settlements would then
    draw 406, closing the channel. (The sink takes each dead letter the second
    time: a redelivery carries the subscriber's 400 out again.)"""
    letters: dict[str, int] = {}

    def behaviour(request, i):
        refused = int(request.headers["ce-id"][-2:]) % 2 == 1
        return Reply(400 if refused else 200, delay=0.3 if i % 3 == 0 else 0.02)

    def sink_behaviour(request, _i):
        event_id = request.headers["ce-id"]
        letters[event_id] = letters.get(event_id, 0) + 1
        return Reply(500 if letters[event_id] == 1 else 200)

    sub = make_subscriber(behaviour)
    sink = make_subscriber(sink_behaviour)
    svc = run_service(
        sub.url,
        parallelism=4,
        delivery={"retry": 0, "backoff_delay": "10ms"},
        dead_letter={"sink": sink.url},
    )
    first_generation = svc.service.supervisor.generation("b")
    ids = [f"n-{i:02d}" for i in range(16)]
    publish_events(svc.queue, ids)
    svc.wait_events("delivered", 8, timeout=20)
    svc.wait_events("dead_lettered", 8, timeout=20)
    wait_until(lambda: queue_depth(svc.queue) == 0, message="the queue to drain")
    assert unacked(svc.queue) == 0
    assert svc.events("requeued") == 8
    assert sorted(sub.ids()) == ids
    assert svc.value("dispatcher_reconnects_total", reason="channel_closed") == 0
    assert svc.service.supervisor.generation("b") == first_generation


def close_channel(svc) -> int:
    """Close binding b's channel on the pika thread, as a broker-side channel error
    would; wait for the new channel. Returns the new generation."""
    supervisor = svc.service.supervisor
    generation = supervisor.generation("b")
    assert supervisor.close_channel("b")
    wait_until(
        lambda: supervisor.generation("b") > generation and supervisor.channel_ready("b"),
        message="a new channel",
    )
    return supervisor.generation("b")


def held_until(release: threading.Event, held: set[str]):
    def behaviour(request, _i):
        if request.headers.get("ce-id") in held:
            release.wait(30)
        return Reply(200)

    return behaviour


def test_work_of_a_closed_channel_keeps_its_slots(make_subscriber, run_service):
    """Invariant 8: two deliveries still running for a closed channel leave the new
    channel two slots, not four; once they are done the binding has all four again."""
    first, second = threading.Event(), threading.Event()

    def behaviour(request, _i):
        event_id = request.headers.get("ce-id")
        if event_id in ("old-1", "old-2"):
            first.wait(30)
        elif event_id in ("old-3", "old-4"):
            second.wait(30)
        return Reply(200, delay=0.2)

    sub = make_subscriber(behaviour)
    svc = run_service(sub.url, parallelism=4, delivery={"timeout": "60s"})
    publish_events(svc.queue, ["old-1", "old-2", "old-3", "old-4"])
    sub.wait_for(4)
    publish_events(svc.queue, [f"new-{i}" for i in range(8)])  # every slot is taken
    close_channel(svc)
    second.set()  # two of the closed channel's deliveries finish: two slots free
    # The new channel's consumer gets prefetch 2. Requeued messages keep their place,
    # so the redeliveries of old-1 and old-2 come first, take both slots and wait for
    # their first attempts, which still run.
    wait_until(
        lambda: svc.service.ready() and svc.value("dispatcher_inflight", binding="b") == 4,
        message="a consumer with old-1 and old-2 redelivered and waiting",
    )
    assert queue_depth(svc.queue) == 10  # old-3, old-4 and the 8 new: 2 + 2, never 2 + 4
    first.set()
    wait_until(lambda: queue_depth(svc.queue) == 0, 20, "the queue to drain")
    wait_until(lambda: svc.events("delivered") == 12, 20, "every delivery line")
    assert sorted(sub.ids()) == sorted(
        [f"old-{i}" for i in range(1, 5)] + [f"new-{i}" for i in range(8)]
    )
    sub.max_concurrent = 0
    publish_events(svc.queue, [f"after-{i}" for i in range(8)])
    wait_until(lambda: svc.events("delivered") == 20, 20, "the later messages")
    assert sub.max_concurrent == 4  # a bigger consumer took the freed slots


def test_ten_channel_closes_hold_one_prefetch_not_ten(make_subscriber, run_service):
    """A broker that closes the channel again and again while every slot is held by
    work of a closed channel: no new consumer, nothing more prefetched, until that
    work is done; then every message is delivered once."""
    release = threading.Event()
    held = {f"held-{i}" for i in range(4)}
    sub = make_subscriber(held_until(release, held))
    svc = run_service(sub.url, parallelism=4, delivery={"timeout": "60s"})
    publish_events(svc.queue, sorted(held))
    sub.wait_for(4)
    publish_events(svc.queue, [f"waiting-{i}" for i in range(20)])
    for _ in range(10):
        close_channel(svc)
        assert not svc.service.ready()  # no room: no consumer, and readiness says so
        assert queue_depth(svc.queue) == 24  # the new channel took nothing
        assert svc.value("dispatcher_inflight", binding="b") == 4
    release.set()
    wait_until(lambda: queue_depth(svc.queue) == 0 and unacked(svc.queue) == 0, 30, "a drain")
    wait_until(lambda: svc.events("delivered") == 24, 20, "every delivery line")
    assert sorted(sub.ids()) == sorted([*held, *(f"waiting-{i}" for i in range(20))])
    assert sub.max_concurrent <= 4
