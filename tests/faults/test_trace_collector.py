"""Invariant 11: a trace collector that is down or hangs costs spans, never time.

The service delivers a steady load while the collector refuses connections
for 30 s (or accepts them and never answers). Every event is delivered, each
within a bound far below the exporter's own timeout (an export waited for on
the loop would hold deliveries for 10 s); every span made is either received
by the collector or counted in ``dispatcher_spans_dropped_total``, and export
resumes once the collector is back. The broker is the shared one: nothing
here faults it.
"""

from __future__ import annotations

import time

import pytest

from tests.support.broker import event_headers, publish, wait_until
from tests.support.otlp import Collector

pytestmark = [pytest.mark.fault, pytest.mark.timeout(240)]

RATE = 100  # events per second, well below capacity: any stall shows as latency
DOWN = 30.0


def publish_for(queue: str, seconds: float, prefix: str) -> list[str]:
    """``RATE`` events a second, each stamped with when it was published."""
    ids: list[str] = []
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * RATE) + 1
        while len(ids) < due:
            event_id = f"{prefix}-{len(ids):05d}"
            stamp = str(time.monotonic())
            publish(queue, headers=event_headers(event_id, **{"ce-sentat": stamp}))
            ids.append(event_id)
        time.sleep(0.005)
    return ids


def latencies(sub) -> list[float]:
    return [r.at - float(r.headers["ce-sentat"]) for r in sub.requests]


@pytest.fixture
def scene(make_subscriber, run_service):
    collector = Collector()
    sub = make_subscriber()
    tracing = {"enabled": True, "endpoint": collector.endpoint, "sample_ratio": 1.0}
    svc = run_service(sub.url, parallelism=20, top={"tracing": tracing})
    yield collector, sub, svc
    collector.stop()


def spans_accounted(collector: Collector, svc, made: int) -> bool:
    return len(collector.spans) + svc.value("dispatcher_spans_dropped_total") == made


def test_a_collector_down_for_30s_under_load_costs_spans_never_deliveries(scene):
    collector, sub, svc = scene
    collector.stop()
    ids = publish_for(svc.queue, DOWN, "down")
    svc.wait_events("delivered", len(ids), timeout=30)
    assert svc.events("dead_lettered") == svc.events("requeued") == 0
    assert sorted(sub.ids()) == ids  # each once
    assert max(latencies(sub)) < 2.0
    dropped = svc.value("dispatcher_spans_dropped_total")
    assert dropped > 0
    # Back: export resumes. The spans queued while it was down go first, and
    # until they have, a new span may still find the queue full and be dropped
    # (counted): so a few deliveries, until one of them is seen.
    collector.start()
    after: list[str] = []

    def an_after_span_arrived() -> bool:
        after.append(f"after-{len(after)}")
        publish(svc.queue, headers=event_headers(after[-1], **{"ce-sentat": "0"}))
        wanted = set(after)
        return any(s.attributes.get("cloudevents.event_id") in wanted for s in collector.spans)

    wait_until(
        an_after_span_arrived, 30, "the spans of a delivery after the collector came back", 0.5
    )
    svc.wait_events("delivered", len(ids) + len(after))
    made = 2 * (len(ids) + len(after))  # a CONSUMER and a CLIENT span each
    # Every span is received or counted as dropped, none lost unsaid (the
    # exporter may still be retrying a batch it took while the collector was down).
    wait_until(lambda: spans_accounted(collector, svc, made), 30, "every span accounted for")


def test_a_collector_that_never_answers_holds_no_delivery(scene):
    collector, sub, svc = scene
    collector.hang()
    try:
        ids = publish_for(svc.queue, 10.0, "hang")
        svc.wait_events("delivered", len(ids), timeout=30)
        assert max(latencies(sub)) < 2.0
        assert sorted(sub.ids()) == ids
    finally:
        collector.answer_again()
