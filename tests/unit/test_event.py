"""Message -> CloudEvent -> HTTP/AMQP mapping (no broker needed)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.delivery.seams import parse_head
from dispatcher.errors import EventError, NotACloudEvent
from dispatcher.event import amqp as amqp_binding
from dispatcher.event import cloudevent as events
from dispatcher.event import http as http_binding
from dispatcher.event import json_format
from dispatcher.event.cloudevent import AmqpMessage, Event

REQUIRED = {"specversion": "1.0", "id": "e1", "source": "/src", "type": "t.x"}


def binary(prefix: str, extra: dict[str, object] | None = None, **kw: object) -> AmqpMessage:
    headers = {prefix + k: v for k, v in {**REQUIRED, **(extra or {})}.items()}
    return AmqpMessage(body=b"data", headers=headers, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefix", ["ce-", "cloudEvents_", "cloudEvents:", "", "CE-"])
def test_every_binary_header_form_is_read(prefix):
    event = amqp_binding.from_amqp(binary(prefix, content_type="text/plain"))
    assert dict(event.attributes) == {**REQUIRED, "datacontenttype": "text/plain"}
    assert event.data == b"data"


def test_bare_form_takes_extensions_but_not_broker_headers():
    message = binary("", {"myext": "v"})
    message = AmqpMessage(
        message.body, {**message.headers, "x-death": [{"count": 1}], "x-delivery-count": 3}
    )
    event = amqp_binding.from_amqp(message)
    assert event.attributes["myext"] == "v"
    assert "x-death" not in event.attributes


def test_the_knative_ingress_layout_carries_no_invented_attributes():
    """eventing-rabbitmq's ingress (``CloudEventToRabbitMQMessage``) writes its span's
    W3C context as bare headers and ``time`` as Go's zero instant when the event had
    none; Knative's dispatcher reads neither as the event's (and its SDK drops a zero
    time). The trace headers still go on as trace headers."""
    trace = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "tracestate": "k=v"}
    headers = {**REQUIRED, "content-type": "text/plain", "time": "0001-01-01T00:00:00Z", **trace}
    message = AmqpMessage(b"data", headers)
    event = amqp_binding.from_amqp(message)
    assert dict(event.attributes) == REQUIRED
    assert http_binding.trace_headers(message.headers) == trace
    timed = AmqpMessage(b"data", {**headers, "time": "2026-01-02T03:04:05Z"})
    assert amqp_binding.from_amqp(timed).attributes["time"] == "2026-01-02T03:04:05Z"


def test_prefixed_form_ignores_other_headers():
    message = binary("ce-")
    message = AmqpMessage(message.body, {**message.headers, "id": "other", "x-death": []})
    assert amqp_binding.from_amqp(message).id == "e1"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("s", "s"),
        (b"bytes", "bytes"),
        (42, "42"),
        (True, "true"),
        (False, "false"),
        (decimal.Decimal("1.50"), "1.50"),
        (dt.datetime(2026, 1, 2, 3, 4, 5), "2026-01-02T03:04:05Z"),  # pika: naive UTC
        (
            dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))),
            "2026-01-02T03:04:05+02:00",
        ),
        (1.5, "1.5"),
    ],
)
def test_header_value_types_pika_delivers(value, text):
    event = amqp_binding.from_amqp(binary("ce-", {"myext": value}))
    assert event.attributes["myext"] == text


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"myext": {"nested": 1}}, "type dict"),
        ({"myext": [1, 2]}, "type list"),
        ({"myext": b"\xff"}, "not valid UTF-8"),
        ({"subject": "a\r\nb"}, "control characters"),
        ({"subject": "a\nb"}, "control characters"),
        ({"specversion": "0.3"}, "unsupported specversion"),
        ({"time": "yesterday"}, "not an RFC 3339 timestamp"),
        ({"time": "2026-01-02T03:04:05"}, "no time zone"),
        ({"Bad-Name": "x"}, "invalid CloudEvent"),
        ({"id": ""}, "missing required attribute(s): id"),
        ({"datacontenttype": "t\u00e9xt/plain"}, "not a printable ASCII media type"),
    ],
)
def test_malformed_events_raise_with_a_reason(extra, reason):
    with pytest.raises(EventError) as caught:
        amqp_binding.from_amqp(binary("ce-", extra))
    assert not isinstance(caught.value, NotACloudEvent)
    assert reason in caught.value.reason


def test_missing_required_attributes_are_not_invented():
    # The SDK constructor would fill in id and time; the mapping must not.
    headers = {"ce-specversion": "1.0", "ce-source": "/s", "ce-type": "t"}
    with pytest.raises(EventError, match="missing required attribute"):
        amqp_binding.from_amqp(AmqpMessage(b"", headers))
    event = amqp_binding.from_amqp(AmqpMessage(b"", {**headers, "ce-id": "1"}))
    assert "time" not in event.attributes


def test_no_specversion_is_not_a_cloudevent():
    with pytest.raises(NotACloudEvent):
        amqp_binding.from_amqp(AmqpMessage(b"x", {"ce-id": "1", "foo": "bar"}))


def test_structured_message():
    document = {
        **REQUIRED,
        "datacontenttype": "application/json",
        "data": {"a": [1, 2]},
        "count": 3,
        "flag": True,
    }
    message = AmqpMessage(
        json.dumps(document).encode(),
        {},
        content_type="application/cloudevents+json; charset=utf-8",
    )
    event = amqp_binding.from_amqp(message)
    assert json.loads(event.data or b"") == {"a": [1, 2]}
    assert event.attributes["count"] == "3"
    assert event.attributes["flag"] == "true"


def test_structured_base64_and_text_data():
    b64 = {**REQUIRED, "data_base64": base64.b64encode(b"\x00\x01").decode()}
    text = {**REQUIRED, "datacontenttype": "text/plain", "data": "h\u00e9"}
    ct = "application/cloudevents+json"
    assert amqp_binding.from_amqp(AmqpMessage(json.dumps(b64).encode(), {}, ct)).data == b"\x00\x01"
    assert (
        amqp_binding.from_amqp(AmqpMessage(json.dumps(text).encode(), {}, ct)).data
        == "h\u00e9".encode()
    )


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        (b"{not json", "application/cloudevents+json", "not valid JSON"),
        (b"[1]", "application/cloudevents+json", "not a JSON object"),
        (b"{}", "application/cloudevents-batch+json", "unsupported structured content type"),
        (
            json.dumps({**REQUIRED, "data_base64": "!!"}).encode(),
            "application/cloudevents+json",
            "not valid base64",
        ),
        (
            json.dumps({**REQUIRED, "sub": {"x": 1}}).encode(),
            "application/cloudevents+json",
            "must be a string",
        ),
    ],
)
def test_bad_structured_messages(body, content_type, reason):
    with pytest.raises(EventError) as caught:
        amqp_binding.from_amqp(AmqpMessage(body, {}, content_type))
    assert reason in caught.value.reason


def test_wrapped_id_is_stable_across_redeliveries_and_distinct_per_body():
    first = AmqpMessage(b"body", {"k": "v"}, "text/plain", properties=SimpleNamespace(app_id="a"))
    redelivered = AmqpMessage(
        b"body",
        {"k": "v", "x-delivery-count": 2, "x-death": [{}]},
        "text/plain",
        properties=SimpleNamespace(app_id="a"),
    )
    other = AmqpMessage(b"other", {"k": "v"}, "text/plain", properties=SimpleNamespace(app_id="a"))
    a, b, c = (amqp_binding.wrap(m, "/", "orders") for m in (first, redelivered, other))
    assert a.id == b.id != c.id
    assert a.source == "rabbitmq://%2F/orders"
    assert a.type == "dev.dispatcher.rabbitmq.message"
    assert a.attributes["datacontenttype"] == "text/plain"
    events.validated(dict(a.attributes), a.data)  # a valid CloudEvent


def test_wrapped_id_prefers_message_id():
    wrapped = amqp_binding.wrap(AmqpMessage(b"x", {}, message_id="m-1"), "vh", "q")
    assert wrapped.id == "m-1"
    assert wrapped.source == "rabbitmq://vh/q"


def test_binary_http_request():
    event = Event(
        {**REQUIRED, "datacontenttype": "application/json", "subject": 'a "b" 100%'}, b"{}"
    )
    parts = http_binding.to_http(event, "binary", {"traceparent": "00-abc-def-01"})
    assert parts.headers["content-type"] == "application/json"
    assert parts.headers["ce-id"] == "e1"
    assert parts.headers["ce-subject"] == "a%20%22b%22%20100%25"
    assert parts.headers["traceparent"] == "00-abc-def-01"
    assert parts.body == b"{}"


@pytest.mark.parametrize(
    ("content_type", "data", "key", "expected"),
    [
        ("application/json", b'{"a": 1}', "data", {"a": 1}),
        (None, b"[1,2]", "data", [1, 2]),
        ("text/plain", b"hello", "data", "hello"),
        ("application/octet-stream", b"\x00\xff", "data_base64", "AP8="),
        ("application/json", b"not json", "data_base64", base64.b64encode(b"not json").decode()),
    ],
)
def test_structured_http_request(content_type, data, key, expected):
    attributes = dict(REQUIRED)
    if content_type:
        attributes["datacontenttype"] = content_type
    parts = http_binding.to_http(Event(attributes, data), "structured")
    document = json.loads(parts.body)
    assert parts.headers["content-type"] == "application/cloudevents+json"
    assert document[key] == expected
    assert document["id"] == "e1"


def test_trace_headers_only_clean_values():
    found = http_binding.trace_headers(
        {"traceparent": "00-a-b-01", "tracestate": "x\r\ny: z", "other": "v"}
    )
    assert found == {"traceparent": "00-a-b-01"}


def test_reply_in_binary_mode():
    reply = http_binding.from_http_response(
        {
            "ce-specversion": "1.0",
            "ce-id": "r1",
            "ce-source": "/r",
            "ce-type": "t",
            "ce-subject": "a%20b",
            "content-type": "application/json",
        },
        b'{"ok": true}',
    )
    assert reply is not None
    assert reply.attributes["subject"] == "a b"
    assert reply.data == b'{"ok": true}'
    assert reply.attributes["datacontenttype"] == "application/json"


def test_reply_in_structured_mode_and_no_reply():
    document = json.dumps({**REQUIRED, "data": {"x": 1}}).encode()
    reply = http_binding.from_http_response(
        {"Content-Type": "application/cloudevents+json"}, document
    )
    assert reply is not None and reply.id == "e1"
    assert http_binding.from_http_response({"content-type": "application/json"}, b"{}") is None


def _binary_reply(**extra: bytes) -> dict[str, str]:
    """A binary reply's headers as ``seams.parse_head`` makes them of the bytes read."""
    lines = [b"HTTP/1.1 200 OK\r\n", b"ce-specversion: 1.0\r\n", b"ce-id: r1\r\n"]
    lines += [b"ce-type: t\r\n", b"ce-source: /r\r\n"]
    lines += [f"ce-{name}: ".encode() + value + b"\r\n" for name, value in extra.items()]
    return parse_head(lines)


@pytest.mark.parametrize(
    "raw", ["/caf%C3%A9 \u65e5\u672c".encode(), "/caf\u00e9 \u65e5\u672c".encode()]
)
def test_a_reply_header_is_utf_8_percent_encoded_or_raw(raw: bytes) -> None:
    """The CloudEvents HTTP binding's encoding (percent-encoded UTF-8), and raw UTF-8
    as some servers send it: never read as Latin-1 (``/cafÃ©``)."""
    reply = http_binding.from_http_response(_binary_reply(subject=raw), b"")
    assert reply is not None
    assert reply.attributes["subject"] == "/caf\u00e9 \u65e5\u672c"


@pytest.mark.parametrize("raw", [b"%FF%FE", b"caf\xe9"])
def test_a_reply_header_that_is_not_utf_8_is_refused_not_replaced(raw: bytes) -> None:
    with pytest.raises(EventError, match="'ce-subject' is not valid UTF-8"):
        http_binding.from_http_response(_binary_reply(subject=raw), b"")


def test_a_chunked_answers_trailers_are_not_its_headers() -> None:
    """The lines curl hands over for a chunked 200 with trailers (checked with
    pycurl against a server that sends them): a plain answer whose trailers say
    ``ce-specversion`` is no reply."""
    lines = [
        b"HTTP/1.1 200 OK\r\n",
        b"Transfer-Encoding: chunked\r\n",
        b"Trailer: ce-specversion\r\n",
        b"\r\n",
        b"ce-specversion: 1.0\r\n",
        b"ce-id: x\r\n",
    ]
    headers = parse_head(lines)
    assert headers == {"transfer-encoding": "chunked", "trailer": "ce-specversion"}
    assert http_binding.from_http_response(headers, b"ok") is None


def test_only_the_final_responses_headers_count() -> None:
    lines = [b"HTTP/1.1 100 Continue\r\n", b"ce-id: early\r\n", b"\r\n"]
    lines += [b"HTTP/1.1 200 OK\r\n", b"content-type: text/plain\r\n", b"\r\n"]
    assert parse_head(lines) == {"content-type": "text/plain"}


def test_invalid_reply_raises():
    with pytest.raises(EventError, match="missing required attribute"):
        http_binding.from_http_response({"ce-specversion": "1.0", "ce-source": "/r"}, b"")


def test_amqp_headers_round_trip():
    event = Event({**REQUIRED, "datacontenttype": "text/plain", "myext": "v"}, b"d")
    headers, content_type = amqp_binding.to_amqp_headers(event)
    again = amqp_binding.from_amqp(AmqpMessage(event.data or b"", headers, content_type))
    assert again == Event(dict(event.attributes), b"d")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        ('{"specversion":"1.0","id":"1","source":"/s","type":"t","data":NaN}', "not JSON"),
        ('{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1e400}', "out of range"),
        ("[" * 100_000, "nested too deeply"),
        ('{"specversion":1.0,"id":"1","source":"/s","type":"t"}', "must be a JSON string"),
        (
            '{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data_base64":"AA=="}',
            "both data and data_base64",
        ),
    ],
)
def test_structured_documents_that_are_not_valid_cloudevents_json(document, reason):
    message = AmqpMessage(document.encode(), {}, "application/cloudevents+json")
    with pytest.raises(EventError) as caught:
        amqp_binding.from_amqp(message)
    assert reason in caught.value.reason


def test_structured_output_splices_json_data_byte_for_byte():
    data = b'{"precise": 1.00000000000000001, "big": 12345678901234567890.5, "k": 1, "k": 2}'
    parts = http_binding.to_http(
        Event({**REQUIRED, "datacontenttype": "application/json"}, data), "structured"
    )
    assert parts.body.endswith(b',"data":' + data + b"}")
    assert json.loads(parts.body)["id"] == "e1"


def test_deeply_nested_json_data_goes_base64_not_crash():
    data = b"[" * 100_000
    document = json.loads(http_binding.to_http(Event(dict(REQUIRED), data), "structured").body)
    assert base64.b64decode(document["data_base64"]) == data


def test_reply_detection():
    assert http_binding.is_http_cloudevent({"Ce-Specversion": "1.0"})
    assert http_binding.is_http_cloudevent({"Content-Type": "application/cloudevents+json"})
    assert not http_binding.is_http_cloudevent({"content-type": "text/html"})


def test_wrapped_id_depends_on_identity_properties_only():
    props = SimpleNamespace(app_id="a", priority=5)
    same = SimpleNamespace(app_id="a", priority=9)  # priority is not identity
    other = SimpleNamespace(app_id="b", priority=5)
    a, b, c = (
        amqp_binding.wrap(AmqpMessage(b"x", {}, properties=p), "/", "q").id
        for p in (props, same, other)
    )
    assert a == b != c


@pytest.mark.parametrize(
    "data",
    [
        b'{"x": 1.000000000000000000001,  "big": 123456789012345678901234567890, "y" : [1, 2]}',
        b'"caf\\u00e9"',
        b"[ ]",
        b"1e5",
    ],
)
def test_structured_input_keeps_json_data_byte_for_byte(data):
    # Decoding and re-encoding would round the numbers and change the spacing.
    body = b'{"specversion":"1.0","id":"1","source":"/s","type":"t",\n "data" : ' + data + b" }"
    message = AmqpMessage(body, {}, "application/cloudevents+json")
    assert amqp_binding.from_amqp(message).data == data


def test_the_last_of_repeated_data_members_wins_as_in_json_loads():
    body = b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data": [2]}'
    message = AmqpMessage(body, {}, "application/cloudevents+json")
    assert amqp_binding.from_amqp(message).data == b"[2]"


def test_validation_verdicts_do_not_depend_on_what_was_seen_before():
    # Accepted names are remembered; an empty value or a bad name must still be refused.
    good = {"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "subject": "x"}
    assert events.validated(dict(good), None).id == "1"
    assert events.validated(dict(good), None).id == "1"
    with pytest.raises(EventError, match="subject"):
        events.validated({**good, "subject": ""}, None)
    with pytest.raises(EventError, match="Bad_Name"):
        events.validated({**good, "Bad_Name": "v"}, None)
    with pytest.raises(EventError, match="Bad_Name"):
        events.validated({**good, "Bad_Name": "v"}, None)


def test_structured_utf16_json_is_still_read():
    document = {"specversion": "1.0", "id": "1", "source": "/s", "type": "t", "data": {"a": 1}}
    body = json.dumps(document).encode("utf-16")
    message = AmqpMessage(body, {}, "application/cloudevents+json")
    assert json.loads(amqp_binding.from_amqp(message).data or b"") == {"a": 1}


def test_bytes_names_and_properties_from_pika_become_text():
    # pika gives bytes for names and properties that are not UTF-8; wrapping
    # and digesting must not fail on them (it failed on every redelivery).
    properties = SimpleNamespace(
        headers={b"k\xff": "v", "nested": {b"x\xfe": 1}},
        content_type=b"text/plain\xe9",
        message_id=None,
    )
    message = amqp_binding.amqp_message(b"body", properties)
    assert next(iter(message.headers)) == "k\xff" and message.content_type == "text/plain\xe9"
    event, problem = amqp_binding.read(message, "/", "q")
    assert problem is None and event.type == amqp_binding.WRAPPED_TYPE
    assert (
        event.id
        == amqp_binding.read(amqp_binding.amqp_message(b"body", properties), "/", "q")[0].id
    )


@pytest.mark.parametrize("data", ['{"a": 1}'.encode("utf-8-sig"), '{"a": 1}'.encode("utf-16")])
def test_json_data_that_is_not_plain_utf8_is_not_spliced_raw(data):
    # Spliced as it is, a BOM or UTF-16 would make the structured document invalid.
    event = Event({**REQUIRED, "datacontenttype": "application/json"}, data)
    document = json.loads(json_format.to_json(event))
    assert base64.b64decode(document["data_base64"]) == data


@pytest.mark.parametrize("space", ["", " ", "\t", "\n  ", "\r\n"])
def test_json_data_keeps_its_exact_text_whatever_the_spacing_between_members(space):
    s = space
    body = (
        f'{s}{{{s}"specversion"{s}:{s}"1.0"{s},{s}"id"{s}:{s}"1"{s},{s}"source"{s}:{s}"/s"'
        f'{s},{s}"type"{s}:{s}"t"{s},{s}"data"{s}:{s}[1.50, {{"a" :2}}]{s},{s}"x"{s}:{s}1{s}}}{s}'
    ).encode()
    message = AmqpMessage(body, {}, "application/cloudevents+json")
    assert amqp_binding.from_amqp(message).data == b'[1.50, {"a" :2}]'


@pytest.mark.parametrize("name", ["type", "id", "source", "subject", "myext"])
def test_a_lone_surrogate_spelled_in_json_is_malformed_a_pair_is_a_character(name):
    """JSON's ``\\ud800`` is no character: refused with the reason (it would fail
    every UTF-8 encoding later, the dead letter's too); ``\\ud83d\\ude00`` is 😀."""
    attributes = {"specversion": "1.0", "id": "j-1", "source": "/s", "type": "t"}

    def document(value: str) -> bytes:
        text = json.dumps({**attributes, name: "x"}).replace('"x"', f'"{value}"')
        return text.encode()

    with pytest.raises(EventError) as caught:
        json_format.from_structured("application/cloudevents+json", document("a\\ud800b"))
    assert f"attribute {name!r} contains a lone surrogate" in caught.value.reason
    event = json_format.from_structured("application/cloudevents+json", document("\\ud83d\\ude00"))
    assert event.attributes[name] == "\U0001f600"


@pytest.mark.parametrize(
    ("body", "data"),
    [
        # Laid out as to_json writes, but a member follows the data: not the short cut.
        (b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":[1],"id":"1"}', b"[1]"),
        (b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":1,"data":[2]}', b"[2]"),
        # A "data" key inside the data, and data that is a bare string.
        (
            b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"data":1}}',
            b'{"data":1}',
        ),
        (b'{"specversion":"1.0","id":"1","source":"/s","type":"t","data":"x"} ', b'"x"'),
        # An attribute spelled otherwise than our encoder spells it.
        (b'{"specversion":"1.0","id":"\\u0031","source":"/s","type":"t","data":[3]}', b"[3]"),
    ],
)
def test_data_in_our_own_layout_and_near_misses_keeps_its_exact_text(body, data):
    message = AmqpMessage(body, {}, "application/cloudevents+json")
    assert amqp_binding.from_amqp(message).data == data


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    extensions=st.dictionaries(
        st.sampled_from(["a", "b", "data1"]), st.text(max_size=4) | st.integers(), max_size=2
    ),
    data=_json_values,
    space=st.sampled_from(["", " ", "\n"]),
    trailing=st.sampled_from(["", ',"id":"1"', ',"data":0']),
)
def test_the_short_cut_for_our_layout_reads_what_the_member_scan_reads(
    extensions, data, space, trailing
):
    """``_spliced_data`` (the layout ``to_json`` writes) answers nothing or exactly
    what the member-by-member scan answers, whatever follows or precedes the data."""
    members = {**REQUIRED, **extensions}
    text = (
        json.dumps(members, separators=(",", ":"), ensure_ascii=False)[:-1]
        + ',"data":'
        + space
        + json.dumps(data)
        + space
        + trailing
        + "}"
    )
    document = json_format.strict_json(text)
    spliced = json_format._spliced_data(document, text)
    assert spliced is None or spliced == json_format._raw_member(text, "data")
    if not trailing and not space:
        assert spliced == json.dumps(data)  # our own layout takes the short cut
