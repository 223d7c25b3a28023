"""Where tracing's CPU goes per delivery, timed alone (issue 23): the work on the
engine loop (the sampling decision, the CONSUMER and CLIENT spans, the W3C
header, the log context) and the export thread's OTLP encoding of those spans
(``dispatcher.observe.otlp_encoding``, a batch at a time as the exporter calls it),
for a message sampled without and with a parent, and for one that is not
sampled.

    python tests/bench/trace_cost.py

Prints microseconds of CPU per delivery (best of 5 runs of 20,000 deliveries,
each in a context of its own as on the engine loop, ended spans encoded a
batch of 512 at a time as the export thread takes them, under the service's
garbage-collector settings). The HTTP post of each batch is not in it: W1's
traced rows measure the whole.
"""

from __future__ import annotations

import contextvars
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opentelemetry.sdk.resources import Resource

from dispatcher import __version__
from dispatcher.config import TracingSettings
from dispatcher.event.cloudevent import Event
from dispatcher.observe import logs
from dispatcher.observe.otlp import OtlpTracer
from dispatcher.observe.otlp_encoding import Encoder
from dispatcher.observe.tracing import peer
from tests.bench.payload import SOURCE, TYPE

DELIVERIES = 20_000
BATCH = 512  # the processor's batch (otlp.OtlpTracer)
RUNS = 5
EVENT = Event({"specversion": "1.0", "id": "w1-000123", "source": SOURCE, "type": TYPE}, b"")
PEER = peer("http://127.0.0.1:8080/")
PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"
CASES = {
    "sampled, no parent (a new trace)": (1.0, {}),
    "sampled parent": (1.0, {"traceparent": PARENT + "-01", "tracestate": "vendor=1"}),
    "not sampled: the ratio left it out": (0.0, {}),
    "not sampled: its parent says so": (1.0, {"traceparent": PARENT + "-00"}),
}


def one_run(ratio: float, trace: dict[str, str]) -> tuple[float, float]:
    """(loop us, encoding us) per delivery."""
    settings = TracingSettings(
        enabled=True, endpoint="http://127.0.0.1:9", sample_ratio=ratio, service_name="bench"
    )
    # Nothing is exported by the processor: no schedule, and batches above ours.
    tracer = OtlpTracer(
        settings, settings.traces_url, lambda _n: None, 10**6, 10**7, schedule_delay=3600
    )

    def deliver() -> None:
        span = tracer.begin("b", "q", 1, False, None, EVENT, trace, time.time_ns())
        if span is not None:
            logs.bind_trace(span.trace_id, span.span_id)
            attempt = span.attempt(PEER, 0)
            attempt.end(202, None, False)
            span.end("delivered", 1, 202)

    # As in the service, the export thread takes each batch as it fills: the
    # loop never holds more than a batch of ended spans.
    queue = tracer._processor._batch_processor._queue
    resource = Resource.create({"service.name": "bench"})
    encoder = Encoder(resource.attributes, resource.schema_url, "dispatcher", __version__)
    loop = encoding = 0.0
    for _ in range(DELIVERIES // BATCH):
        contexts = [contextvars.Context() for _ in range(BATCH)]
        started = time.thread_time()
        for context in contexts:
            context.run(deliver)
        loop += time.thread_time() - started
        batch = list(queue)
        queue.clear()
        started = time.thread_time()
        if batch:
            encoder.request(batch)
        encoding += time.thread_time() - started
    count = DELIVERIES // BATCH * BATCH
    loop, encoding = loop / count * 1e6, encoding / count * 1e6
    return loop, encoding


def main() -> int:
    # The service's collector settings (service.Service.start).
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 50, 50)
    print("| message | loop us / delivery | OTLP encoding us / delivery | total |")
    print("|---|---|---|---|")
    for name, (ratio, trace) in CASES.items():
        runs = [one_run(ratio, trace) for _ in range(RUNS)]
        loop = min(r[0] for r in runs)
        encoding = min(r[1] for r in runs)
        print(f"| {name} | {loop:.1f} | {encoding:.1f} | {loop + encoding:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
