"""A delivery's trace, as the core and the HTTP side see it.

With tracing on (``tracing`` settings), every received message gets a
CONSUMER span from its arrival to its settlement, every HTTP attempt a
CLIENT span under it, every dead-letter or reply publish a PRODUCER span;
``dispatcher/observe/otlp.py`` records them with the OpenTelemetry SDK and exports
them over OTLP/HTTP. This module is what the rest of the service sees of
that, and it imports no OpenTelemetry: with tracing off nothing loads it.

The delivery's span rides in ``CURRENT``, a context variable: each delivery
runs as one task of the engine loop, and each task runs in a
``contextvars.Context`` of its own (``loop.Task``), so ``HttpTarget`` and the
dead-letter and reply code find the span of the delivery they work for
without it being passed through every call, and never another's.

``CURRENT`` is ``None`` with tracing off and for a message that was not
sampled: then W3C trace headers pass through unchanged, as they always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from dispatcher.config.redaction import redact_query
from dispatcher.event.cloudevent import Event


@dataclass(frozen=True, slots=True)
class Peer:
    """The attributes of a CLIENT span that one URL fixes, worked out once per
    target: the host, the port and the URL with any ``user:password@`` removed
    (a query only if the URL has one)."""

    address: str
    port: int
    url: str


def peer(url: str) -> Peer:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    full = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    # OpenTelemetry's HTTP conventions: userinfo dropped, signatures REDACTED.
    return Peer(host, port, redact_query(full, "REDACTED"))


class AttemptSpan(Protocol):
    """One HTTP attempt's CLIENT span."""

    @property
    def header_lines(self) -> list[str]:
        """The ``traceparent`` (and ``tracestate``) request header lines of this span."""
        ...

    def end(self, status: int | None, error: str | None, timed_out: bool) -> None: ...


class PublishSpan(Protocol):
    """One publish's PRODUCER span."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The W3C headers the published message carries: this span's context."""
        ...

    def end(self, problem: str | None) -> None: ...


class DeliverySpan(Protocol):
    """A received message's CONSUMER span."""

    @property
    def trace_id(self) -> str:
        """Hex, as log lines carry it."""
        ...

    @property
    def span_id(self) -> str: ...

    def attempt(self, peer: Peer, resend_count: int) -> AttemptSpan: ...

    def publish(self, exchange: str, routing_key: str, purpose: str) -> PublishSpan: ...

    def note(self, name: str, attributes: Mapping[str, str | int | float] | None = None) -> None:
        """A span event: a retry wait, a claim wait, a suppressed duplicate."""
        ...

    def end(self, outcome: str | None, attempts: int, status: int | None) -> None:
        """``outcome``: the delivery line's (``None``: left for redelivery)."""
        ...


class Tracer(Protocol):
    def begin(
        self,
        binding: str,
        queue: str,
        tag: int,
        redelivered: bool,
        message_id: str | None,
        event: Event,
        trace: Mapping[str, str],
        arrived_ns: int,
    ) -> DeliverySpan | None:
        """The delivery's span, or ``None`` when it is not sampled. ``trace``: the
        message's W3C headers (the parent, else the event's ``traceparent``)."""
        ...

    def shutdown(self, timeout: float) -> None:
        """Export what is queued, within ``timeout``; later spans are dropped."""
        ...


CURRENT: ContextVar[DeliverySpan | None] = ContextVar("dispatcher_delivery_span", default=None)


def note(name: str, attributes: Mapping[str, str | int | float] | None = None) -> None:
    """A span event on the current delivery's span, if it has one."""
    span = CURRENT.get()
    if span is not None:
        span.note(name, attributes)
