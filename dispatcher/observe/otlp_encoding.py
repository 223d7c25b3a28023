"""Ended spans as an OTLP/HTTP request body (protobuf), built on the export thread.

The SDK's encoder builds a protobuf message per attribute of every span from
Python (about 35 us a span here, most of a traced delivery's cost). Yet most of
what a span holds is the same for every span of its kind and binding: its
name, kind, flags, status and nearly all of its attributes (queue, binding,
event type and source, outcome, the subscriber's URL, ...). So a span comes
here in two parts: its *shape*, the part that repeats, and what is its own
(ids, times, the delivery tag, the event id). A shape is built once as a
protobuf ``Span`` and serialized by protobuf; each span of that shape is its
own fields plus those bytes merged in (``MergeFromString``: protobuf's rule
that a repeated field appends and a set field overwrites), so the shared part
costs a parse in C instead of a dozen messages built in Python. Nothing of the
wire format is written here: every byte comes out of protobuf.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, SpanFlags, Status
from opentelemetry.trace import SpanContext

Attributes = tuple[tuple[str, Any], ...]

CONSUMER: Final = Span.SpanKind.SPAN_KIND_CONSUMER
CLIENT: Final = Span.SpanKind.SPAN_KIND_CLIENT
PRODUCER: Final = Span.SpanKind.SPAN_KIND_PRODUCER
UNSET: Final = Status.StatusCode.STATUS_CODE_UNSET
ERROR: Final = Status.StatusCode.STATUS_CODE_ERROR
# SpanFlags: whether the parent is remote is known (always, here), and whether it is.
HAS_IS_REMOTE: Final = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
IS_REMOTE: Final = SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
# Shapes kept at once. A shape per (binding, event type and source, outcome,
# attempts, status) is a few dozen in practice; a flood of distinct event types
# empties the cache rather than growing it, and costs a shape built per span,
# as the SDK's encoder does for every span.
SHAPES: Final = 4096


class Shape(NamedTuple):
    """What spans share: hashable, the key its serialized form is kept under."""

    name: str
    kind: int  # Span.SpanKind
    flags: int
    status: int  # Status.StatusCode
    attributes: Attributes


class EndedSpan(NamedTuple):
    """A span to export (``otlp.OtlpTracer`` makes them). Its ``context`` is what
    the SDK's batch processor reads of what it queues (whether it is sampled)."""

    context: SpanContext  # trace and span id, the trace state
    parent_id: int  # 0: a root
    start: int  # ns since the epoch
    end: int
    shape: Shape
    own: Attributes  # attributes no other span is likely to share
    description: str | None  # the status's, when it is an error: often its own text
    events: tuple[tuple[str, Mapping[str, Any] | None, int], ...]  # (name, attributes, ns)


class Encoder:
    """One resource and one instrumentation scope; used by one thread."""

    def __init__(
        self,
        resource: Mapping[str, Any],
        schema_url: str,
        scope: str,
        version: str,
        shapes: int = SHAPES,
    ) -> None:
        self._resource = Resource(attributes=_key_values(resource.items()))
        self._schema_url = schema_url
        self._scope = InstrumentationScope(name=scope, version=version)
        self._shapes: dict[Shape, bytes] = {}
        self._limit = shapes

    def request(self, spans: Sequence[EndedSpan]) -> bytes:
        """An ``ExportTraceServiceRequest`` holding ``spans``, serialized."""
        request = ExportTraceServiceRequest()
        resource = request.resource_spans.add(schema_url=self._schema_url)
        resource.resource.CopyFrom(self._resource)
        scope = resource.scope_spans.add()
        scope.scope.CopyFrom(self._scope)
        add = scope.spans.add
        for s in spans:
            context = s.context
            # Only what is there is passed: an argument of None costs as much.
            span = add(
                trace_id=context.trace_id.to_bytes(16, "big"),
                span_id=context.span_id.to_bytes(8, "big"),
                start_time_unix_nano=s.start,
                end_time_unix_nano=s.end,
            )
            if s.parent_id:
                span.parent_span_id = s.parent_id.to_bytes(8, "big")
            if context.trace_state:
                span.trace_state = context.trace_state.to_header()
            if s.description:
                span.status.message = s.description
            if s.events:
                span.events.extend(_events(s.events))
            attribute = span.attributes.add
            for key, value in s.own:
                _put(attribute(key=key).value, value)
            span.MergeFromString(self._shape(s.shape))
        data: bytes = request.SerializeToString()
        return data

    def _shape(self, shape: Shape) -> bytes:
        found = self._shapes.get(shape)
        if found is None:
            if len(self._shapes) >= self._limit:
                self._shapes.clear()
            found = self._shapes[shape] = Span(
                name=shape.name,
                kind=shape.kind,  # type: ignore[arg-type]
                flags=shape.flags,
                status=Status(code=shape.status),  # type: ignore[arg-type]
                attributes=_key_values(shape.attributes),
            ).SerializeToString()
        return found


def _events(events: Sequence[tuple[str, Mapping[str, Any] | None, int]]) -> list[Span.Event]:
    return [
        Span.Event(
            name=name,
            time_unix_nano=at,
            attributes=_key_values(attributes.items()) if attributes else None,
        )
        for name, attributes, at in events
    ]


def _key_values(pairs: Any) -> list[KeyValue]:
    return [KeyValue(key=key, value=_value(value)) for key, value in pairs]


def _put(into: AnyValue, value: Any) -> None:
    """``_value`` written into a message in place: a third of the time of one
    built and copied in, for the scalars every span has."""
    if isinstance(value, str):
        into.string_value = value
    elif isinstance(value, int) and not isinstance(value, bool):
        into.int_value = value
    else:
        into.CopyFrom(_value(value))


def _value(value: Any) -> AnyValue:
    """The OpenTelemetry attribute types: a scalar or a sequence of them."""
    if isinstance(value, bool):  # before int: a bool is an int
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[_value(v) for v in value]))
    raise TypeError(f"not an attribute value: {type(value).__name__}")
