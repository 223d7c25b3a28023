"""Queue types a binding can meet: a stream is refused, nothing lost and no other
binding disturbed (``dispatcher.broker.streams``); a single-active-consumer
queue, fed by the broker to one consumer only, gets every slot back after a
rebuild and after a breaker's probe (``dispatcher.broker.consumer``)."""

from __future__ import annotations

import threading

import pytest

from tests.conftest import binding_config
from tests.integration.test_generations import close_channel
from tests.support import broker
from tests.support.broker import event_headers, publish, publish_events, queue_depth, wait_until
from tests.support.subscriber import Reply

pytestmark = pytest.mark.broker


def _declare_stream(name: str) -> None:
    with broker.channel() as channel:
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})


def _stream_length(name: str) -> int:
    with broker.channel() as channel:
        return int(channel.queue_declare(name, passive=True).method.message_count)


def test_a_stream_queue_is_refused_and_the_other_bindings_keep_the_connection(
    subscriber, run_service
):
    """Consumed, a stream's events would be delivered once and a requeued one skipped
    for good (a nack closes the whole connection with 540, and a new consumer starts
    at the next message). Refused: none reaches the subscriber, the stream keeps
    them, readiness names nothing up for it, and the classic binding on the same
    connection delivers throughout."""
    stream = broker.unique("stream")
    classic = broker.unique("q")
    _declare_stream(stream)
    bindings = [
        binding_config(classic, subscriber.url),
        binding_config(stream, subscriber.url, name="s", declare=None),
    ]
    svc = run_service(
        subscriber.url,
        queue=classic,
        extra_queues=[stream],
        top={"bindings": bindings},
        wait_ready=False,
    )
    wait_until(
        lambda: svc.value("dispatcher_consumer_up", binding="s") == 1,
        message="a consumer on the stream",
    )
    for n in range(3):
        publish(stream, b"{}", headers=event_headers(f"st-{n}"))
    wait_until(
        lambda: svc.value("dispatcher_reconnects_total", reason="stream_queue") >= 1,
        message="the stream's channel to be closed",
    )
    assert svc.service.ops.readyz() == (503, {"ready": False, "down": ["s"]})
    publish_events(classic, ["c-1"])
    [request] = subscriber.wait_for(1)
    assert request.headers["ce-id"] == "c-1"  # never a stream's event
    # A stream keeps what it was not consumed for (its count lags a little).
    wait_until(lambda: _stream_length(stream) == 3, message="the stream to hold its 3 events")
    # The connection was never closed (a nack on a stream closes it with 540).
    for reason in ("connection_lost", "closed_by_broker"):
        assert svc.value("dispatcher_reconnects_total", reason=reason) == 0
    assert svc.value("dispatcher_consumer_up", binding="b") == 1


def _declare_single_active_consumer(name: str) -> None:
    with broker.channel() as channel:
        channel.queue_declare(name, durable=True, arguments={"x-single-active-consumer": True})


def test_single_active_consumer_with_prefetch_twice_parallelism_keeps_every_slot_after_rebuild(
    make_subscriber, run_service
):
    """The broker gives a single-active-consumer queue's messages to its first
    consumer only. After a rebuild with deliveries of the closed channel still
    running, the new channel's first consumer may prefetch only what they leave
    free; at most ``parallelism`` can run, so with ``prefetch`` twice that (the
    documented advice) the first consumer has every slot."""
    release = threading.Event()

    def behaviour(request, _i):
        if request.headers.get("ce-id", "").startswith("old-"):
            release.wait(30)
        return Reply(200, delay=0.2)

    queue = broker.unique("sac")
    _declare_single_active_consumer(queue)
    sub = make_subscriber(behaviour)
    svc = run_service(sub.url, queue=queue, parallelism=4, prefetch=8, declare=None)
    publish_events(queue, ["old-1", "old-2", "old-3", "old-4"])
    sub.wait_for(4)
    close_channel(svc)  # four still run: the new channel's first consumer gets four
    wait_until(svc.service.ready, message="a consumer on the new channel")
    release.set()
    wait_until(lambda: svc.events("delivered") == 4, 20, "the closed channel's work")
    sub.max_concurrent = 0
    publish_events(queue, [f"after-{i}" for i in range(12)])
    wait_until(lambda: svc.events("delivered") == 16, 20, "the later messages")
    assert sub.max_concurrent == 4
    assert queue_depth(queue) == 0


def test_a_single_active_consumer_queue_gets_every_slot_back_after_a_breaker_cycle(
    make_subscriber, run_service
):
    """Half open, the probe is taken by a consumer of prefetch 1: on a
    single-active-consumer queue that consumer would stay the active one, and the
    binding would run one delivery at a time once the subscriber is back."""
    down = threading.Event()
    down.set()

    def behaviour(_request, _i):
        return Reply(503) if down.is_set() else Reply(200, delay=0.2)

    queue = broker.unique("sac")
    _declare_single_active_consumer(queue)
    sub = make_subscriber(behaviour)
    svc = run_service(
        sub.url,
        queue=queue,
        parallelism=4,
        declare=None,
        delivery={"retry": 0, "timeout": "2s"},
        circuit_breaker={"min_attempts": 2, "window": "5s", "open_for": "200ms"},
    )
    publish_events(queue, [f"fail-{i}" for i in range(2)])
    wait_until(lambda: svc.value("dispatcher_circuit_state", binding="b") == 1, message="it opens")
    down.clear()
    publish_events(queue, ["probe"])
    wait_until(
        lambda: svc.value("dispatcher_circuit_state", binding="b") == 0,
        message="the probe closes it",
    )
    wait_until(lambda: queue_depth(queue) == 0, message="the probe delivered")
    sub.max_concurrent = 0
    publish_events(queue, [f"after-{i}" for i in range(12)])
    wait_until(lambda: sum(i.startswith("after-") for i in sub.ids()) == 12, 20, "the rest")
    assert sub.max_concurrent == 4
