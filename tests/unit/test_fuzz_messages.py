"""Bad-input campaign, message reading: hypothesis generates AMQP messages.

The promise ("bad input never crashes or blocks the queue"): a
message that cannot be read becomes a dead letter with a reason. Here that
means, for every generated message:

- ``amqp_binding.amqp_message`` (on the pika thread) turns pika's properties into an
  ``AmqpMessage`` without raising;
- ``amqp_binding.from_amqp`` returns an event or raises ``EventError`` (its
  subclass ``NotACloudEvent`` included), nothing else;
- ``Handler._read`` (the service's path) gives an event and at most a reason,
  never an "internal error" (its catch-all for exceptions that escape the
  mapping);
- the event becomes a well-formed HTTP request in both content modes (header
  names are tokens, values printable ASCII, as libcurl is given them), as do
  its dead letter and its reply-less forms, and its AMQP header form (dead
  letters to an exchange) is a table pika can encode.

Generated values are what pika 1.4 decodes (``pika/data.py``): str (bytes when
not UTF-8), bytes, bool, int, Decimal, aware and naive datetime, None, lists
and nested tables whose keys may be bytes; floats too (other clients, older
pika). Every run is deterministic (``derandomize=True``, no example database):
CI meets the same inputs every time, so a failure is reproducible from the
log alone and is never a flake. ``FUZZ_EXAMPLES=N`` raises the number of
examples for a local campaign (``derandomize`` then still gives one fixed
sequence per N).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import re
from types import SimpleNamespace
from typing import Any

import pika.data
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from dispatcher.config import settings_from_dict
from dispatcher.delivery.deadletter import dead_letter_event
from dispatcher.delivery.handler import Handler
from dispatcher.delivery.verdicts import Failure
from dispatcher.errors import EventError
from dispatcher.event import amqp as amqp_binding
from dispatcher.event import http as http_binding
from dispatcher.event import json_format
from dispatcher.event.cloudevent import AmqpMessage, Event
from tests.support.fuzz import fuzz_settings

FUZZ = fuzz_settings(200, suppress=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_BODY = 64  # a small limit, so that generated bodies reach it on both sides
PREFIXES = ("ce-", "cloudEvents_", "cloudEvents:", "", "CE-", "CLOUDEVENTS:")
ATTRIBUTES = (
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "dataschema",
    "datacontenttype",
    "myext",
    "traceparent",
    "tracestate",
)
TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


# --------------------------------------------------------------------- strategies

invalid_utf8 = st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xc0\xaf", b"a\x80b"])
text_or_bytes = st.one_of(
    st.text(max_size=20),
    st.binary(max_size=20),
    st.builds(lambda a, b: a + b, st.binary(max_size=8), invalid_utf8),
)
# pika: a decimal is an int32 scaled by 10**-decimals, decimals an octet.
pika_decimal = st.builds(
    lambda raw, decimals: decimal.Decimal(raw) * (decimal.Decimal(10) ** -decimals),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
)
any_datetime = st.one_of(
    st.datetimes(),  # naive (pika < 1.3: UTC)
    st.datetimes(timezones=st.just(dt.UTC)),  # pika 1.4
    st.datetimes(
        timezones=st.integers(-1439, 1439).map(lambda m: dt.timezone(dt.timedelta(minutes=m)))
    ),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(),
    pika_decimal,
    any_datetime,
    st.text(),
    st.binary(max_size=40),
    st.builds(lambda a, b: a + b, st.binary(max_size=8), invalid_utf8),
)
header_value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(text_or_bytes, inner, max_size=4),
    ),
    max_leaves=12,
)
good_values = {
    "specversion": st.sampled_from(["1.0", "1.0", "0.3", "", "1.0\r\n"]),
    "id": st.one_of(st.just("e1"), st.text(max_size=10)),
    "source": st.one_of(st.just("/src"), st.text(max_size=10)),
    "type": st.one_of(st.just("t.x"), st.text(max_size=10)),
    "time": st.one_of(
        st.just("2026-01-02T03:04:05Z"),
        st.datetimes().map(lambda d: d.isoformat()),
        st.text(max_size=30),
    ),
}


def attribute_value(name: str) -> st.SearchStrategy[Any]:
    plain = good_values.get(name, st.text(max_size=10))
    return st.one_of(plain, plain.map(lambda v: v.encode("utf-8")), header_value)


@st.composite
def header_name(draw: st.DrawFn) -> str | bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        name = draw(st.sampled_from(PREFIXES)) + draw(st.sampled_from(ATTRIBUTES))
    elif choice == 1:
        name = draw(st.sampled_from(PREFIXES)) + draw(st.text(max_size=12))
    elif choice == 2:
        name = draw(st.text(max_size=30))
    else:
        raw = draw(st.binary(max_size=30)) + draw(invalid_utf8)
        return raw  # pika: a name that is not UTF-8 arrives as bytes
    return name if len(name.encode("utf-8")) <= 255 else name[:60]


@st.composite
def amqp_headers(draw: st.DrawFn) -> dict[str | bytes, Any]:
    headers: dict[str | bytes, Any] = {}
    # Every form in one message, in any order, required attributes likely present.
    for prefix in draw(st.lists(st.sampled_from(PREFIXES), max_size=4)):
        for name in draw(st.lists(st.sampled_from(ATTRIBUTES), max_size=6)):
            headers[prefix + name] = draw(attribute_value(name))
    for _ in range(draw(st.integers(0, 4))):
        headers[draw(header_name())] = draw(header_value)
    return headers


content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/cloudevents+json",
            "application/cloudevents+json; charset=utf-8",
            "APPLICATION/CLOUDEVENTS+JSON",
            "application/cloudevents-batch+json",
            "application/cloudevents",
            "application/json",
            "text/plain",
            "text/plain\r\nx-injected: 1",
            "",
        ]
    ),
    text_or_bytes,
)


@st.composite
def structured_body(draw: st.DrawFn) -> bytes:
    """JSON-format CloudEvents, broken in every way the format allows."""
    kind = draw(st.integers(0, 5))
    # JSON can spell what no UTF-8 holds: a lone surrogate (json.dumps escapes it).
    surrogates = st.sampled_from(["\ud800", "a\udfffb", "\udc00\ud800", "\ud83d\ude00"])
    json_value = st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text()
        | surrogates,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )
    if kind == 0:  # not an object
        return json.dumps(draw(json_value)).encode()
    members: list[tuple[str, Any]] = [
        ("specversion", draw(st.sampled_from(["1.0", "1.0", "0.3", 1.0]))),
        ("id", draw(st.one_of(st.just("e1"), surrogates, json_value))),
        ("source", draw(st.one_of(st.just("/s"), surrogates, json_value))),
        ("type", draw(st.one_of(st.just("t"), surrogates, json_value))),
    ]
    names = st.one_of(st.sampled_from([*ATTRIBUTES, "data", "data_base64"]), st.text(max_size=300))
    for _ in range(draw(st.integers(0, 4))):
        members.append((draw(names), draw(json_value)))
    if kind == 1:  # duplicate keys: the text repeats a member
        members += draw(st.lists(st.sampled_from(members), max_size=3))
    text = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}"
    body = text.encode("utf-8")
    if kind == 2:
        position = draw(st.integers(0, len(body)))
        body = body[:position] + draw(invalid_utf8) + body[position:]
    if kind == 3:
        body = text.encode(draw(st.sampled_from(["utf-16", "utf-32", "utf-8-sig"])))
    if kind == 4:
        body = body[: draw(st.integers(0, len(body)))]
    return body


bodies = st.one_of(
    st.binary(max_size=MAX_BODY + 2),
    st.sampled_from([b"", b"x" * (MAX_BODY - 1), b"x" * MAX_BODY, b"x" * (MAX_BODY + 1)]),
    structured_body(),
)


@st.composite
def pika_properties(draw: st.DrawFn) -> SimpleNamespace:
    """What pika's BasicProperties holds after decoding a content header frame."""
    short = st.one_of(st.none(), text_or_bytes)
    return SimpleNamespace(
        content_type=draw(content_types),
        content_encoding=draw(short),
        headers=draw(st.one_of(st.none(), amqp_headers())),
        delivery_mode=draw(st.one_of(st.none(), st.integers(0, 255))),
        priority=draw(st.one_of(st.none(), st.integers(0, 255))),
        correlation_id=draw(short),
        reply_to=draw(short),
        expiration=draw(short),
        message_id=draw(short),
        timestamp=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        type=draw(short),
        user_id=draw(short),
        app_id=draw(short),
        cluster_id=draw(short),
    )


# --------------------------------------------------------------------- the property


def make_handler(non_cloudevent: str) -> Handler:
    raw = {
        "bindings": [
            {
                "name": "b",
                "queue": "q",
                "subscriber": "http://127.0.0.1:9/",
                "non_cloudevent": non_cloudevent,
                "max_body_size": MAX_BODY,
            }
        ]
    }
    binding = settings_from_dict(raw, {}).bindings[0]
    stub = SimpleNamespace(deadline_seconds=lambda: 1.0, time=lambda: 0.0, enabled=False)
    return Handler(binding, "/", stub, stub, stub, stub, stub, stub, stub)  # type: ignore[arg-type]


HANDLERS = {mode: make_handler(mode) for mode in ("wrap", "dead_letter")}


def assert_http_well_formed(headers: dict[str, str], body: bytes) -> None:
    assert isinstance(body, bytes)
    for name, value in headers.items():
        assert isinstance(name, str)
        assert TOKEN.match(name), f"header name {name!r} is not an HTTP token"
        assert isinstance(value, str)
        assert value.isascii(), f"header {name}: {value!r} is not ASCII (libcurl gets bytes)"
        assert not re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value), f"header {name}: {value!r}"


def assert_event_forwardable(event: Event, message: AmqpMessage) -> None:
    for name, value in event.attributes.items():
        assert isinstance(name, str)
        assert isinstance(value, str)
    assert event.id and event.source and event.type
    assert isinstance(event.key, tuple)
    assert event.data is None or isinstance(event.data, bytes)
    trace = http_binding.trace_headers(message.headers)
    for mode in ("binary", "structured"):
        request = http_binding.to_http(event, mode, trace)
        assert_http_well_formed(request.headers, request.body)
    document = json.loads(json_format.to_json(event))
    assert isinstance(document, dict)
    letter = dead_letter_event(event, "http://sink/", Failure(-1, reason="a reason\r\n"))
    for mode in ("binary", "structured"):
        request = http_binding.to_http(letter, mode)
        assert_http_well_formed(request.headers, request.body)
    headers, content_type = amqp_binding.to_amqp_headers(letter)
    pika.data.encode_table([], headers)  # what the publisher sends: must encode
    if content_type is not None:
        pika.data.encode_short_string([], content_type)


def check_message(body: bytes, properties: SimpleNamespace) -> None:
    message = amqp_binding.amqp_message(body, properties)
    with contextlib.suppress(EventError):  # the documented refusal; nothing else
        amqp_binding.from_amqp(message)
    for handler in HANDLERS.values():
        event, problem = handler._read(message)
        assert problem is None or not problem.startswith("internal error"), problem
        if len(body) > MAX_BODY:
            assert problem is not None and "max_body_size" in problem
        assert_event_forwardable(event, message)


def props(**kw: Any) -> SimpleNamespace:
    fields = dict.fromkeys(
        (
            "content_type",
            "content_encoding",
            "headers",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "type",
            "user_id",
            "app_id",
            "cluster_id",
        )
    )
    return SimpleNamespace(**{**fields, **kw})


REQUIRED = {"specversion": "1.0", "id": "e1", "source": "/s", "type": "t"}


@FUZZ
@given(body=bodies, properties=pika_properties())
def test_any_message_is_read_or_refused_with_a_reason(body: bytes, properties: Any) -> None:
    check_message(body, properties)


@FUZZ
@given(
    body=bodies,
    content_type=content_types,
    forms=st.lists(st.sampled_from(PREFIXES), min_size=1, max_size=4),
    extra=st.dictionaries(st.sampled_from(ATTRIBUTES), header_value, max_size=3),
)
def test_every_header_form_mixed_in_one_message(
    body: bytes, content_type: Any, forms: list[str], extra: dict[str, Any]
) -> None:
    headers: dict[str, Any] = {}
    for prefix in forms:
        headers.update({prefix + k: v for k, v in {**REQUIRED, **extra}.items()})
    check_message(body, props(headers=headers, content_type=content_type))


@FUZZ
@given(body=structured_body(), content_type=st.sampled_from(["application/cloudevents+json"]))
def test_structured_json_of_any_shape(body: bytes, content_type: str) -> None:
    check_message(body, props(content_type=content_type))
    # Most of these bodies are over the handlers' small limit, so they are
    # wrapped unread there: what the mapping accepts must be forwardable too.
    message = amqp_binding.amqp_message(body, props(content_type=content_type))
    with contextlib.suppress(EventError):
        assert_event_forwardable(amqp_binding.from_amqp(message), message)


@st.composite
def well_formed_json_event(draw: st.DrawFn) -> bytes:
    """A JSON-format event whose shape is right (an object, specversion 1.0, the
    required members strings): what varies is the text of every value, where
    ``structured_body``'s broken shapes rarely get a parse that far."""
    text = st.one_of(
        st.text(min_size=1, max_size=12),
        st.sampled_from(["\ud800", "a\udfffb", "\ud83d\ude00", "\u0085", "\ufffe", "é"]),
    )
    members = {"specversion": "1.0", "id": draw(text), "source": draw(text), "type": draw(text)}
    extra = st.sampled_from(["subject", "time", "dataschema", "myext", "traceparent", "data"])
    members.update(draw(st.dictionaries(extra, text, max_size=3)))
    return json.dumps(members).encode()


@FUZZ
@given(body=well_formed_json_event())
def test_well_formed_json_events_with_any_text(body: bytes) -> None:
    message = amqp_binding.amqp_message(body, props(content_type="application/cloudevents+json"))
    with contextlib.suppress(EventError):
        assert_event_forwardable(amqp_binding.from_amqp(message), message)


# --------------------------------------------------------------------- the big ones


def nested(depth: int, bytes_keys: bool = True) -> dict[Any, Any]:
    table: dict[Any, Any] = {"leaf": b"\xff"}
    for _ in range(depth):
        # A chain, as pika decodes one (each table once: no shared subtrees).
        table = {"t": table, b"\xfe" if bytes_keys else "a": [1, [{"x": None}]]}
    return table


def test_a_table_nested_1000_deep_in_every_form() -> None:
    # Found by this campaign: the wrapped id's digest (json.dumps, then repr)
    # raised RecursionError, in the handler's own fallback as well.
    for deep in (nested(1000), nested(1000, bytes_keys=False), nested(20_000)):
        for prefix in PREFIXES[:4]:
            headers = {**{prefix + k: v for k, v in REQUIRED.items()}, prefix + "myext": deep}
            check_message(b"x", props(headers=headers))
        check_message(b"x", props(headers={"x-deep": deep}))  # not a CloudEvent: wrapped


def test_the_id_of_a_deeply_nested_wrapped_message_is_stable_and_distinct() -> None:
    def wrapped_id(body: bytes, depth: int) -> str:
        message = amqp_binding.amqp_message(body, props(headers={"x-deep": nested(depth)}))
        return amqp_binding.wrap(message, "/", "q").id

    assert wrapped_id(b"a", 1000) == wrapped_id(b"a", 1000)
    assert len({wrapped_id(b"a", 1000), wrapped_id(b"b", 1000), wrapped_id(b"a", 1001)}) == 3


def test_ten_thousand_headers() -> None:
    headers: dict[str, Any] = {f"{p}h{i}": i for i in range(2500) for p in PREFIXES[:4]}
    check_message(b"x", props(headers=headers))
    check_message(b"x", props(headers={**headers, "ce-specversion": "1.0"}))
    for prefix in PREFIXES[:4]:
        check_message(
            b"x", props(headers={**headers, **{prefix + k: v for k, v in REQUIRED.items()}})
        )


def test_invalid_utf8_in_every_property() -> None:
    bad = b"\xff\xfe"
    for name in ("content_type", "content_encoding", "message_id", "type", "app_id", "user_id",
                 "correlation_id", "reply_to", "expiration", "cluster_id"):  # fmt: skip
        for headers in (None, {f"ce-{k}": v for k, v in REQUIRED.items()}, {bad: bad}):
            check_message(bad, props(headers=headers, **{name: bad}))


def test_bodies_at_the_limit_on_both_sides() -> None:
    ce = {f"ce-{k}": v for k, v in REQUIRED.items()}
    structured = "application/cloudevents+json"
    for size in (0, MAX_BODY - 1, MAX_BODY, MAX_BODY + 1):
        for headers, content_type in ((ce, None), (None, None), (None, structured)):
            body = b"x" * size
            check_message(body, props(headers=headers, content_type=content_type))
            _event, problem = HANDLERS["wrap"]._read(
                amqp_binding.amqp_message(body, props(headers=headers, content_type=content_type))
            )
            too_big = problem is not None and "exceeds max_body_size" in problem
            assert too_big == (size > MAX_BODY)
