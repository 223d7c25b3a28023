"""Queue types a binding can meet: a stream is refused, nothing lost and no other
binding disturbed (``dispatcher.broker.streams``)."""

from __future__ import annotations

import pytest

from tests.conftest import binding_config
from tests.support import broker
from tests.support.broker import event_headers, publish, publish_events, wait_until

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
