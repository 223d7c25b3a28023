"""A real OTLP/HTTP trace receiver for the tests.

An HTTP server that takes ``POST /v1/traces`` as a collector does and decodes
each body with ``opentelemetry-proto`` (the protobuf definitions every
collector uses), so what the tests read is what a collector would have read
off the wire. It can answer 500, or be stopped and started again on the same
port (a collector that is down).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

KINDS = {value: name.removeprefix("SPAN_KIND_") for name, value in Span.SpanKind.items()}
STATUS = {value: name.removeprefix("STATUS_CODE_") for name, value in Status.StatusCode.items()}


@dataclass
class ReceivedSpan:
    name: str
    kind: str  # CONSUMER, CLIENT, PRODUCER, ...
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    attributes: dict[str, Any]
    status: str  # UNSET, OK, ERROR
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str
    start_ns: int
    end_ns: int
    flags: int = 0
    trace_state: str = ""

    def event_names(self) -> list[str]:
        return [name for name, _ in self.events]


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return None if which is None else getattr(value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass
class Collector:
    """``answer``: the HTTP status every export gets (200: accepted)."""

    answer: int = 200
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._answering = threading.Event()
        self._answering.set()
        self._cond = threading.Condition()
        self._port = 0
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def endpoint(self) -> str:
        """The base URL, as ``tracing.endpoint`` takes it."""
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        server = ThreadingHTTPServer(("127.0.0.1", self._port), self._handler_class())
        server.daemon_threads = True
        self._port = server.server_address[1]
        self._server = server
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        """Down: the port refuses connections until ``start``."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def hang(self) -> None:
        """Take connections and requests, answer none (for up to a minute each)
        until ``answer_again``: a collector that is stuck."""
        self._answering.clear()

    def answer_again(self) -> None:
        self._answering.set()

    def _take(self, body: bytes, headers: dict[str, str]) -> int:
        self._answering.wait(60)
        request = ExportTraceServiceRequest.FromString(body)
        with self._cond:
            self.requests += 1
            self.headers.append(headers)
            if self.answer != 200:
                return self.answer
            for resource_spans in request.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(_received(span, resource, scope_spans.scope.name))
            self._cond.notify_all()
        return 200

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0, what: str = ""
    ) -> list[ReceivedSpan]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not found(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s.kind, s.name) for s in self.spans]
                    raise AssertionError(f"collector never saw {what or found}: {names}")
                self._cond.wait(left)
            return list(self.spans)

    def wait_spans(self, count: int, timeout: float = 15.0) -> list[ReceivedSpan]:
        return self.wait_for(lambda spans: len(spans) >= count, timeout, f"{count} spans")

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self.spans if s.trace_id == trace_id]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                status = 404
                if self.path == "/v1/traces":
                    status = collector._take(body, {k.lower(): v for k, v in self.headers.items()})
                payload = ExportTraceServiceResponse().SerializeToString() if status == 200 else b""
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *_args: Any) -> None:
                pass

        return Handler


def _received(span: Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        kind=KINDS[span.kind],
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        attributes=_attributes(span.attributes),
        status=STATUS[span.status.code],
        status_message=span.status.message,
        events=[(e.name, _attributes(e.attributes)) for e in span.events],
        resource=resource,
        scope=scope,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        flags=span.flags,
        trace_state=span.trace_state,
    )
