"""The OpenTelemetry side of tracing: sampling, the bound on spans waiting for the
collector, what a collector that is down costs, and that tracing off never
loads OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import structlog

from dispatcher.config import TracingSettings
from dispatcher.event.cloudevent import Event
from dispatcher.observe.otlp import OtlpTracer
from dispatcher.observe.otlp_encoding import Encoder
from dispatcher.observe.tracing import peer
from tests.support.broker import wait_until
from tests.support.otlp import Collector

EVENT = Event({"specversion": "1.0", "id": "e-1", "source": "/s", "type": "t"}, b"")
PARENT = "4bf92f3577b34da6a3ce929d0e0e4736"


class Count:
    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def __call__(self, n: int) -> None:
        with self._lock:
            self.value += n


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.stop()


def tracer(collector: Collector, ratio: float = 1.0, dropped: Count | None = None, **kw):
    settings = TracingSettings(
        enabled=True, endpoint=collector.endpoint, sample_ratio=ratio, service_name="unit"
    )
    made = OtlpTracer(settings, settings.traces_url, dropped or Count(), **kw)
    return made


def deliver(t: OtlpTracer, trace: dict[str, str] | None = None, event: Event = EVENT):
    span = t.begin("b", "q", 1, False, None, event, trace or {}, 1)
    if span is not None:
        span.attempt(peer("http://s/"), 0).end(200, None, False)
        span.end("delivered", 1, 200)
    return span


def test_ratio_zero_samples_no_new_trace_and_one_samples_all(collector):
    off, on = tracer(collector, 0.0), tracer(collector, 1.0)
    try:
        assert all(deliver(off) is None for _ in range(200))
        assert all(deliver(on) is not None for _ in range(200))
    finally:
        off.shutdown(5)
        on.shutdown(5)


def test_the_parent_s_sampled_flag_decides_whatever_the_ratio(collector):
    t = tracer(collector, 0.0)
    try:
        sampled = deliver(t, {"traceparent": f"00-{PARENT}-00f067aa0ba902b7-01"})
        assert sampled is not None and sampled.trace_id == PARENT
        unsampled = {"traceparent": f"00-{PARENT}-00f067aa0ba902b7-00"}
        assert deliver(tracer(collector, 1.0), unsampled) is None
        # A malformed parent is none: a new root, by the ratio (0 here).
        assert deliver(t, {"traceparent": "00-xyz-01"}) is None
    finally:
        t.shutdown(5)


def test_spans_beyond_the_queue_are_dropped_and_counted_at_once(collector):
    dropped = Count()
    # The exporter never runs meanwhile: a long schedule, batches above the queue.
    t = tracer(collector, dropped=dropped, queue_size=10, batch_size=512, schedule_delay=600)
    try:
        for _ in range(5):
            deliver(t)  # two spans each: the queue is full
        assert dropped.value == 0
        for _ in range(3):
            deliver(t)
        assert dropped.value == 6
    finally:
        t.shutdown(5)
    assert len(collector.spans) == 10  # the queued ones, exported at shutdown


def test_a_collector_that_is_down_costs_spans_and_export_resumes(collector, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    dropped = Count()
    collector.stop()
    t = tracer(collector, dropped=dropped, batch_size=2, schedule_delay=0.05)
    try:
        for _ in range(3):
            deliver(t)
        wait_until(lambda: dropped.value == 6, 15, "six spans counted as dropped")
        collector.start()
        deliver(t)
        collector.wait_spans(2)
    finally:
        t.shutdown(5)
    assert dropped.value == 6


def test_a_collector_that_answers_500_costs_spans(collector, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    collector.answer = 500
    dropped = Count()
    t = tracer(collector, dropped=dropped, batch_size=2, schedule_delay=0.05)
    try:
        deliver(t)
        wait_until(lambda: dropped.value == 2, 15, "two spans counted as dropped")
    finally:
        t.shutdown(5)


def test_spans_it_cannot_encode_are_dropped_counted_and_said_once(collector, monkeypatch):
    """A bug in our encoding must cost spans, never the processor's thread: the
    batch is dropped and counted, one warning says why, and once batches encode
    again one line says export works."""
    dropped = Count()
    t = tracer(collector, dropped=dropped, batch_size=2, schedule_delay=0.05)

    def broken(_self: Encoder, _spans: object) -> bytes:
        raise ValueError("cannot encode")

    with structlog.testing.capture_logs() as logged:
        try:
            monkeypatch.setattr(Encoder, "request", broken)
            for _ in range(2):
                deliver(t)
                wait_until(lambda: t.taken == t.given, 15, "the batch taken")
            monkeypatch.undo()
            deliver(t)
            collector.wait_spans(2)
        finally:
            t.shutdown(5)  # the export thread has said all it will say
    assert dropped.value == 4
    said = [(e["event"], e.get("error")) for e in logged if "trace export" in e["event"]]
    assert said == [
        ("trace export failed: spans dropped", "ValueError('cannot encode')"),
        ("trace export works again", None),
    ]


def test_shutdown_is_bounded_when_the_collector_hangs(collector):
    collector.hang()
    t = tracer(collector, batch_size=2, schedule_delay=0.05)
    try:
        deliver(t)
        wait_until(lambda: t.taken == 2, 10, "an export under way")
        done = threading.Event()
        threading.Thread(target=lambda: (t.shutdown(0.5), done.set()), daemon=True).start()
        assert done.wait(5), "shutdown waited for a collector that does not answer"
    finally:
        collector.answer_again()


def test_peer_drops_userinfo_and_keeps_a_query_only_if_there_is_one():
    assert peer("http://u:p@h:8080/x?y=1") == peer("http://h:8080/x?y=1")
    assert peer("http://u:p@h:8080/x?y=1").url == "http://h:8080/x?y=1"
    assert peer("https://h/").port == 443 and peer("http://h").url == "http://h/"
    assert peer("http://h/x?").url == "http://h/x"
    assert peer("http://[::1]:81/").address == "::1"


def test_peer_redacts_signatures_in_the_query():
    """OpenTelemetry's HTTP conventions: an Azure SAS or AWS/Google signed URL's
    signature is REDACTED in ``url.full``; the other parameters stay."""
    signed = "https://h/hook?sv=2024&sig=c2VjcmV0&AWSAccessKeyId=AKIA1&password=pw"
    assert peer(signed).url == (
        "https://h/hook?sv=2024&sig=REDACTED&AWSAccessKeyId=REDACTED&password=REDACTED"
    )


@pytest.mark.parametrize(("enabled", "loaded"), [(False, False), (True, True)])
def test_opentelemetry_is_loaded_only_with_tracing_on(enabled, loaded):
    script = textwrap.dedent(
        f"""
        import sys
        from dispatcher.config import settings_from_dict
        from dispatcher.service import Service
        raw = {{
            "http": {{"listen": "127.0.0.1:0"}},
            "tracing": {{"enabled": {enabled}}},
            "bindings": [{{"name": "a", "queue": "q", "subscriber": "http://s/"}}],
        }}
        service = Service(settings_from_dict(raw, {{}}))
        print(any(name.startswith("opentelemetry") for name in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == str(loaded)
