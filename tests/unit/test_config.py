"""Configuration: YAML + environment -> Settings, and every error naming its key."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import (
    AttributesFilter,
    AuthSettings,
    BindingSettings,
    BrokerSettings,
    CesqlFilter,
    CircuitBreakerSettings,
    DeadLetterSettings,
    DeclareSettings,
    DeliverySettings,
    HttpSettings,
    LoggingSettings,
    MatchFilter,
    NestingFilter,
    ReconnectSettings,
    ReplySettings,
    Settings,
    ShutdownSettings,
    TlsSettings,
    effective_config,
    load_batch_settings,
    load_settings,
    parse_duration,
    redact_url,
    render_effective_config,
    settings_from_dict,
)
from dispatcher.config.advice import advice
from dispatcher.errors import ConfigError
from dispatcher.resolve import resolve

SUBSCRIBER = "http://127.0.0.1:8080/"


def binding(**overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"name": "orders", "queue": "orders", "subscriber": SUBSCRIBER}
    raw.update(overrides)
    return raw


def build(environ: dict[str, str] | None = None, **top: Any) -> Settings:
    raw: dict[str, Any] = {"bindings": [binding()]}
    raw.update(top)
    return settings_from_dict(raw, environ or {})


def error_of(environ: dict[str, str] | None = None, **top: Any) -> str:
    with pytest.raises(ConfigError) as info:
        build(environ, **top)
    return str(info.value)


def binding_error(**overrides: Any) -> str:
    return error_of(bindings=[binding(**overrides)])


def write(tmp_path: Path, text: str, name: str = "dispatcher.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


MINIMAL = f"""\
bindings:
  - name: orders
    queue: orders
    subscriber: {SUBSCRIBER}
"""


# --------------------------------------------------------------------------
# A full file, defaults, and the effective config
# --------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN-----\n", encoding="utf-8")
        files[name] = str(tmp_path / name)
    (tmp_path / "token").write_text("t0ken\n", encoding="utf-8")
    files["token"] = str(tmp_path / "token")
    return files


def full_yaml(tls: dict[str, str]) -> str:
    return f"""\
    broker:
      url: amqps://broker.example:5671/prod
      heartbeat: 5s
      connection_name: dispatcher-a
      tls: {{ca_file: {tls["ca.pem"]}, cert_file: {tls["cert.pem"]}, key_file: {tls["key.pem"]}}}
      reconnect: {{initial_delay: 100ms, max_delay: 1m}}
      blocked_timeout: 45s
    http:
      listen: 127.0.0.1:9191
    shutdown:
      grace: 40s
    logging: {{level: DEBUG, format: console}}
    bindings:
      - name: orders
        queue: orders-q
        declare: {{durable: true, type: quorum, dead_letter_exchange: dlx, delivery_limit: 3}}
        subscriber: https://orders.example/events
        content_mode: structured
        tls: {{ca_file: {tls["ca.pem"]}, cert_file: null, key_file: null}}
        parallelism: 20
        prefetch: 1
        ordered: true
        delivery:
          retry: 3
          backoff_policy: linear
          backoff_delay: 500ms
          backoff_max: 2m
          timeout: PT15S
          retry_on: [409, "5xx"]
          rate_limit: 2.5
        circuit_breaker:
          {{failure_ratio: 0.25, min_attempts: 8, window: 10s, open_for: 5s, max_open: 1m}}
        auth: {{bearer_token_file: {tls["token"]}}}
        headers: {{X-Tenant: blue}}
        filter: {{attributes: {{type: com.example.a, source: ""}}}}
        filters:
          - prefix: {{type: com.example.}}
          - any: [{{exact: {{region: eu}}}}, {{not: {{suffix: {{source: /test}}}}}}]
        dedupe_window: 5m
        dead_letter:
          sink: http://dls.example/
          exchange: dead
          routing_key: orders.dead
        reply:
          exchange: replies
          routing_key: orders.reply
          url: null
        non_cloudevent: dead_letter
        max_body_size: 1MiB
      - name: audit
        queue: audit
        declare: null
        subscriber: http://audit.example/
        reply: {{url: https://ingress.example/}}
    """


def full_expected(tls: dict[str, str]) -> Settings:
    return Settings(
        broker=BrokerSettings(
            url="amqps://broker.example:5671/prod",
            heartbeat=5.0,
            connection_name="dispatcher-a",
            tls=TlsSettings(
                ca_file=tls["ca.pem"], cert_file=tls["cert.pem"], key_file=tls["key.pem"]
            ),
            reconnect=ReconnectSettings(initial_delay=0.1, max_delay=60.0),
            blocked_timeout=45.0,
        ),
        http=HttpSettings(listen="127.0.0.1:9191"),
        shutdown=ShutdownSettings(grace=40.0),
        logging=LoggingSettings(level="debug", format="console"),
        bindings=(
            BindingSettings(
                name="orders",
                queue="orders-q",
                subscriber="https://orders.example/events",
                declare=DeclareSettings(
                    durable=True, type="quorum", dead_letter_exchange="dlx", delivery_limit=3
                ),
                content_mode="structured",
                tls=TlsSettings(ca_file=tls["ca.pem"]),
                parallelism=20,
                prefetch=1,
                ordered=True,
                delivery=DeliverySettings(
                    retry=3,
                    backoff_policy="linear",
                    backoff_delay=0.5,
                    backoff_max=120.0,
                    timeout=15.0,
                    retry_on=(409, "5xx"),
                    rate_limit=2.5,
                ),
                circuit_breaker=CircuitBreakerSettings(
                    failure_ratio=0.25, min_attempts=8, window=10.0, open_for=5.0, max_open=60.0
                ),
                auth=AuthSettings(bearer_token_file=tls["token"]),
                headers=(("X-Tenant", "blue"),),
                filter=AttributesFilter(attributes=(("type", "com.example.a"), ("source", ""))),
                filters=(
                    MatchFilter("prefix", (("type", "com.example."),)),
                    NestingFilter(
                        "any",
                        (
                            MatchFilter("exact", (("region", "eu"),)),
                            NestingFilter("not", (MatchFilter("suffix", (("source", "/test"),)),)),
                        ),
                    ),
                ),
                dedupe_window=300.0,
                dead_letter=DeadLetterSettings(
                    sink="http://dls.example/", exchange="dead", routing_key="orders.dead"
                ),
                reply=ReplySettings(exchange="replies", routing_key="orders.reply"),
                non_cloudevent="dead_letter",
                max_body_size=1024 * 1024,
            ),
            BindingSettings(
                name="audit",
                queue="audit",
                subscriber="http://audit.example/",
                reply=ReplySettings(url="https://ingress.example/"),
            ),
        ),
    )


def test_full_config_with_every_key_loads_exactly(
    tmp_path: Path, tls_files: dict[str, str]
) -> None:
    path = write(tmp_path, full_yaml(tls_files))
    assert load_settings(path, {}) == full_expected(tls_files)


def test_effective_config_round_trips_through_yaml(
    tmp_path: Path, tls_files: dict[str, str]
) -> None:
    settings = load_settings(write(tmp_path, full_yaml(tls_files)), {})
    rendered = render_effective_config(settings)
    again = load_settings(write(tmp_path, rendered, "effective.yaml"), {})
    assert again == settings


def test_render_lists_keys_in_product_order(tmp_path: Path, tls_files: dict[str, str]) -> None:
    settings = load_settings(write(tmp_path, full_yaml(tls_files)), {})
    document = yaml.safe_load(render_effective_config(settings))
    assert list(document) == [
        "broker",
        "http",
        "shutdown",
        "logging",
        "dedupe",
        "tracing",
        "bindings",
    ]
    assert list(document["broker"]) == [
        "url",
        "heartbeat",
        "connection_name",
        "tls",
        "reconnect",
        "blocked_timeout",
    ]
    assert list(document["bindings"][0]) == [
        "name",
        "queue",
        "declare",
        "subscriber",
        "content_mode",
        "tls",
        "parallelism",
        "prefetch",
        "ordered",
        "delivery",
        "circuit_breaker",
        "auth",
        "headers",
        "filter",
        "filters",
        "dedupe_window",
        "dead_letter",
        "reply",
        "non_cloudevent",
        "max_body_size",
    ]
    assert list(document["bindings"][0]["delivery"]) == [
        "retry",
        "backoff_policy",
        "backoff_delay",
        "backoff_max",
        "timeout",
        "retry_on",
        "rate_limit",
    ]
    assert list(document["bindings"][0]["circuit_breaker"]) == [
        "failure_ratio",
        "min_attempts",
        "window",
        "open_for",
        "max_open",
    ]


def test_defaults_match_product_md(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, MINIMAL), {})
    assert settings.broker.url == "amqp://guest:guest@localhost:5672/%2F"
    assert settings.broker.heartbeat == 20.0
    assert settings.broker.connection_name == "dispatcher"
    assert settings.broker.tls == TlsSettings()
    assert settings.broker.reconnect == ReconnectSettings(initial_delay=0.2, max_delay=30.0)
    assert settings.broker.blocked_timeout == 60.0
    assert (settings.http.listen, settings.http.host, settings.http.port) == (
        "0.0.0.0:9090",
        "0.0.0.0",
        9090,
    )
    assert settings.shutdown.grace == 25.0
    assert settings.logging == LoggingSettings(level="info", format="json")
    [b] = settings.bindings
    assert (b.name, b.queue, b.subscriber) == ("orders", "orders", SUBSCRIBER)
    assert b.declare is None
    assert b.content_mode == "binary"
    assert b.tls == TlsSettings()
    assert (b.parallelism, b.prefetch, b.ordered) == (10, None, False)
    assert b.delivery == DeliverySettings(
        retry=5, backoff_policy="exponential", backoff_delay=0.2, backoff_max=30.0, timeout=10.0
    )
    assert b.delivery.rate_limit is None
    assert b.circuit_breaker is None
    assert b.dedupe_window == 600.0
    assert b.dead_letter == DeadLetterSettings(sink=None, exchange=None, routing_key="")
    assert b.reply == ReplySettings(exchange=None, routing_key="", url=None)
    assert b.non_cloudevent == "wrap"
    assert b.max_body_size == 8 * 1024 * 1024


def test_effective_config_renders_durations_in_file_notation() -> None:
    effective = effective_config(build())
    broker = effective["broker"]
    assert isinstance(broker, dict)
    assert broker["heartbeat"] == "20s"
    assert broker["reconnect"] == {"initial_delay": "200ms", "max_delay": "30s"}
    bindings = effective["bindings"]
    assert isinstance(bindings, list)
    assert bindings[0]["dedupe_window"] == "10m"
    assert bindings[0]["delivery"]["backoff_delay"] == "200ms"
    assert bindings[0]["max_body_size"] == "8MiB"


@pytest.mark.parametrize(
    ("written", "rendered"),
    [("1h", "1h"), ("90s", "90s"), ("1500ms", "1500ms"), (0, "0s"), (0.0001, 0.0001)],
)
def test_durations_render_exactly(written: object, rendered: object) -> None:
    settings = build(shutdown={"grace": written})
    assert effective_config(settings)["shutdown"] == {"grace": rendered}


def test_null_sections_and_values_mean_defaults() -> None:
    settings = build(
        broker=None,
        http={"listen": None},
        bindings=[binding(declare=None, dead_letter=None, reply=None, tls=None, delivery=None)],
    )
    assert settings == Settings(
        bindings=(BindingSettings(name="orders", queue="orders", subscriber=SUBSCRIBER),)
    )


def test_empty_declare_mapping_declares_with_defaults() -> None:
    [b] = build(bindings=[binding(declare={})]).bindings
    assert b.declare == DeclareSettings(durable=True, type="classic")


# --------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (3, 3.0),
        (2.5, 2.5),
        (0, 0.0),
        ("90", 90.0),
        ("1.5", 1.5),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("1m30s", 90.0),
        (" 10s ", 10.0),
        ("PT0.25S", 0.25),
        ("PT1M30S", 90.0),
        ("PT2H", 7200.0),
        ("P1D", 86400.0),
        ("P1DT2H", 93600.0),
        ("PT0,5S", 0.5),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    assert parse_duration(value, "k") == pytest.approx(seconds)


def test_parse_duration_returns_float() -> None:
    assert isinstance(parse_duration(3, "k"), float)


@pytest.mark.parametrize(
    "value", ["abc", "", "5 minutes", "10S", "PT", "P", "P1DT", "1.2.3s", "1d"]
)
def test_parse_duration_rejects_garbage(value: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "bindings[0].delivery.timeout")
    assert str(info.value) == (
        f"bindings[0].delivery.timeout: invalid duration {value!r} "
        "(use 250ms, 1.5s, 2m, PT0.25S or seconds)"
    )


def test_parse_duration_message_for_abc_is_exact() -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration("abc", "shutdown.grace")
    assert str(info.value) == (
        "shutdown.grace: invalid duration 'abc' (use 250ms, 1.5s, 2m, PT0.25S or seconds)"
    )
    assert info.value.key == "shutdown.grace"


@pytest.mark.parametrize("value", ["P1Y", "P2M", "P1Y2M3D"])
def test_iso_years_and_months_are_rejected(value: str) -> None:
    with pytest.raises(ConfigError, match="years and months") as info:
        parse_duration(value, "k")
    assert info.value.key == "k"


@pytest.mark.parametrize("value", [True, False, None, [1], {"s": 1}])
def test_parse_duration_rejects_non_durations(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "k")
    assert info.value.key == "k"


@pytest.mark.parametrize("value", [-1, -0.5, "-1s", "-PT1S"])
def test_negative_durations_are_rejected(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(value, "k")
    assert str(info.value) == "k: must be >= 0"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 10**400])
def test_non_finite_durations_are_rejected(value: object) -> None:
    with pytest.raises(ConfigError, match="must be a finite duration"):
        parse_duration(value, "k")


@pytest.mark.parametrize("value", ["3000000h", "87601h", "P3651D", 10**32, "1" + "0" * 32 + "s"])
def test_durations_past_ten_years_are_refused(value: object) -> None:
    """``check`` passed them and ``run`` crashed at SIGTERM (a thread's wait cannot
    hold 3,000,000 h) or failed every delivery (libcurl's timeout is a C long)."""
    with pytest.raises(ConfigError, match="must be at most 3650 days"):
        parse_duration(value, "k")


def test_ten_years_is_the_longest_duration() -> None:
    assert parse_duration("P3650D", "k") == 3650 * 86400.0
    assert error_of(shutdown={"grace": "3000000h"}).startswith(
        "shutdown.grace: must be at most 3650 days"
    )


def test_bad_duration_in_a_file_names_the_key() -> None:
    message = binding_error(delivery={"backoff_delay": "soon"})
    assert message.startswith("bindings[0].delivery.backoff_delay: invalid duration 'soon'")


# --------------------------------------------------------------------------
# Unknown keys and wrong types
# --------------------------------------------------------------------------


def test_unknown_top_level_key() -> None:
    assert error_of(brokers={}) == (
        "brokers: unknown key (expected one of: "
        "bindings, broker, dedupe, http, logging, shutdown, tracing)"
    )


def test_unknown_binding_key() -> None:
    message = binding_error(subscribr=SUBSCRIBER)
    assert message.startswith("bindings[0].subscribr: unknown key (expected one of: ")
    assert "subscriber" in message


_RETRY_ON = "bindings[0].delivery.retry_on"
_WRITTEN = "is written by dispatcher (the CloudEvent, its body or HTTP framing)"
_PRINTABLE = "must be printable ASCII: no line breaks or control characters"
_STATUS_OR_CLASS = "must be a status (409) or one of 4xx, 5xx"


@pytest.mark.parametrize(
    ("retry_on", "message"),
    [
        ([200], f"{_RETRY_ON}[0]: 200 is a success: it is never retried"),
        ([409, 99], f"{_RETRY_ON}[1]: must be an HTTP status between 100 and 599, got 99"),
        ([600], f"{_RETRY_ON}[0]: must be an HTTP status between 100 and 599, got 600"),
        (["6xx"], f"{_RETRY_ON}[0]: {_STATUS_OR_CLASS}, got '6xx'"),
        (["2xx"], f"{_RETRY_ON}[0]: {_STATUS_OR_CLASS}, got '2xx'"),
        (
            "5xx",
            f"{_RETRY_ON}: must be a list of statuses and classes (e.g. [409, 5xx]), got '5xx'",
        ),
    ],
)
def test_retry_on_refuses_what_cannot_be_retried(retry_on, message) -> None:
    assert binding_error(delivery={"retry_on": retry_on}) == message


def test_retry_on_reads_numbers_strings_and_classes() -> None:
    raw = {"name": "b", "queue": "q", "subscriber": "http://h/"}
    raw["delivery"] = {"retry_on": [409, "503", "5XX", 409]}
    settings = settings_from_dict({"bindings": [raw]}, {})
    assert settings.bindings[0].delivery.retry_on == (409, 503, "5xx")
    default = settings_from_dict({"bindings": [{**raw, "delivery": {}}]}, {})
    assert default.bindings[0].delivery.retry_on == (404, 408, 409, 429, "5xx")


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ("x", "bindings[0].headers: must be a mapping of header names to values, got 'x'"),
        (
            {"bad name": "x"},
            "bindings[0].headers: 'bad name' is not a header name (RFC 9110 token)",
        ),
        ({"ce-id": "x"}, f"bindings[0].headers.ce-id: {_WRITTEN}"),
        ({"Content-Type": "x"}, f"bindings[0].headers.Content-Type: {_WRITTEN}"),
        ({"Host": "h"}, f"bindings[0].headers.Host: {_WRITTEN}"),
        ({"Transfer-Encoding": "chunked"}, f"bindings[0].headers.Transfer-Encoding: {_WRITTEN}"),
        ({"X-A": "1\r\nX-B: 2"}, f"bindings[0].headers.X-A: {_PRINTABLE}"),
        ({"X-A": "caf\u00e9"}, f"bindings[0].headers.X-A: {_PRINTABLE}"),
        ({"X-A": True}, "bindings[0].headers.X-A: must be a string, got true"),
        (
            {"X-A": "1", "x-a": "2"},
            "bindings[0].headers.x-a: is listed twice (header names ignore case)",
        ),
    ],
)
def test_headers_refuses_what_would_break_or_replace_a_request(headers, message) -> None:
    assert binding_error(headers=headers) == message


def test_an_authorization_header_conflicts_with_basic_auth_in_a_url() -> None:
    assert binding_error(
        dead_letter={"sink": "http://u:p@sink/"}, headers={"authorization": "Bearer t"}
    ) == (
        "bindings[0].headers.Authorization: conflicts with the user:password@ of "
        "dead_letter.sink (sent as Basic auth)"
    )


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text("eyJ.token.sig\n")
    return str(path)


def test_a_bearer_token_file_is_read_at_start(token_file) -> None:
    raw = {"name": "b", "queue": "q", "subscriber": "http://h/"}
    settings = settings_from_dict(
        {"bindings": [{**raw, "auth": {"bearer_token_file": token_file}}]}, {}
    )
    assert settings.bindings[0].auth.bearer_token_file == token_file
    rendered = render_effective_config(settings)
    assert "eyJ" not in rendered  # the path is shown, never the token
    assert yaml.safe_load(rendered)["bindings"][0]["auth"] == {"bearer_token_file": token_file}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "empty"),
        (b" \n\t\n", "empty"),
        (b"tok\nen", "holds characters an HTTP header cannot carry"),
        (b"caf\xc3\xa9", "holds characters an HTTP header cannot carry"),
        (b"x" * (64 * 1024 + 1), "larger than 65536 bytes"),
    ],
)
def test_a_token_file_without_a_usable_token_is_a_config_error(tmp_path, content, problem) -> None:
    # The token is read in the resolve step `check` and `run` share.
    path = tmp_path / "token"
    path.write_bytes(content)
    raw = {"bindings": [binding(auth={"bearer_token_file": str(path)})]}
    with pytest.raises(ConfigError) as info:
        settings_from_dict(raw, {}, resolve=resolve)
    assert str(info.value) == f"bindings[0].auth.bearer_token_file: no token in {path}: {problem}"


def test_a_missing_token_file_is_a_config_error(tmp_path) -> None:
    missing = tmp_path / "nope"
    assert binding_error(auth={"bearer_token_file": str(missing)}) == (
        f"bindings[0].auth.bearer_token_file: file not found: {missing}"
    )


@pytest.mark.parametrize("key", ["subscriber", "dead_letter", "reply"])
def test_a_bearer_token_conflicts_with_basic_auth_in_any_url(token_file, key) -> None:
    urls: dict[str, object] = {
        "subscriber": {"subscriber": "http://u:p@h/"},
        "dead_letter": {"dead_letter": {"sink": "http://u:p@sink/"}},
        "reply": {"reply": {"url": "http://u:p@ingress/"}},
    }
    where = {"subscriber": "subscriber", "dead_letter": "dead_letter.sink", "reply": "reply.url"}
    assert binding_error(auth={"bearer_token_file": token_file}, **urls[key]) == (
        f"bindings[0].auth.bearer_token_file: conflicts with the user:password@ of {where[key]} "
        "(sent as Basic auth)"
    )


def test_an_authorization_header_conflicts_with_a_bearer_token(token_file) -> None:
    assert (
        binding_error(auth={"bearer_token_file": token_file}, headers={"Authorization": "Basic x"})
        == "bindings[0].headers.Authorization: conflicts with auth.bearer_token_file"
    )


_NOT_A_NAME = "is not an attribute name (a lower-case letter, then lower-case letters and digits)"


@pytest.mark.parametrize(
    ("binding_keys", "message"),
    [
        ({"filter": "x"}, "bindings[0].filter: must be a mapping, got 'x'"),
        (
            {"filter": {"type": "a"}},
            "bindings[0].filter.type: unknown key (expected one of: attributes)",
        ),
        (
            {"filter": {"attributes": ["type"]}},
            "bindings[0].filter.attributes: must be a mapping of attribute names to values, "
            "got list",
        ),
        (
            {"filter": {"attributes": {"Type": "a"}}},
            f"bindings[0].filter.attributes: 'Type' {_NOT_A_NAME}",
        ),
        (
            {"filter": {"attributes": {"specversion": 1.0}}},
            "bindings[0].filter.attributes.specversion: must be a string (quote it), got 1.0",
        ),
        (
            {"filters": {"exact": {"type": "a"}}},
            "bindings[0].filters: must be a list of filters, got mapping",
        ),
        (
            {"filters": [{"exact": {"type": "a"}}, {"any": [{"cesql": "type = 'a' AND"}]}]},
            "bindings[0].filters[1].any[0].cesql: column 15: the expression ends too soon "
            "in \"type = 'a' AND\"",
        ),
        (
            {"filters": [{"all": [{"not": {"cesql": "type == 'a'"}}]}]},
            "bindings[0].filters[0].all[0].not.cesql: column 7: unexpected '=' in \"type == 'a'\"",
        ),
        (
            {"filters": [{"cesql": "LENGTH(id, 2) > 3"}]},
            "bindings[0].filters[0].cesql: column 1: LENGTH with 2 arguments: "
            "LENGTH takes 1 arguments in 'LENGTH(id, 2) > 3'",
        ),
        (
            {"filters": [{"cesql": "STARTS_WITH(type, 'a')"}]},
            "bindings[0].filters[0].cesql: column 1: STARTS_WITH with 2 arguments: "
            "STARTS_WITH is not a function in \"STARTS_WITH(type, 'a')\"",
        ),
        (
            {"filters": [{"cesql": "seq < 2147483648"}]},
            "bindings[0].filters[0].cesql: column 7: 2147483648 is not a 32-bit integer "
            "in 'seq < 2147483648'",
        ),
        (
            {"filters": [{"cesql": "my_ext = 'a'"}]},
            "bindings[0].filters[0].cesql: column 1: my_ext is not an attribute name "
            "(lower-case letters and digits) in \"my_ext = 'a'\"",
        ),
        (
            {"filters": [{"cesql": " "}]},
            "bindings[0].filters[0].cesql: must be a CESQL expression, got an empty string",
        ),
        (
            {"filters": [{"cesql": True}]},
            "bindings[0].filters[0].cesql: must be a string, got true",
        ),
        (
            {"filters": [{"equals": {"type": "a"}}]},
            "bindings[0].filters[0].equals: unknown filter dialect "
            "(expected one of: exact, prefix, suffix, all, any, not, cesql)",
        ),
        (
            {"filters": [{"exact": {"type": "a"}, "prefix": {"id": "b"}}]},
            "bindings[0].filters[0]: a filter has exactly one dialect, found exact and prefix",
        ),
        ({"filters": [{}]}, "bindings[0].filters[0]: a filter has exactly one dialect, found none"),
        (
            {"filters": [{"exact": {}}]},
            "bindings[0].filters[0].exact: must name at least one attribute",
        ),
        (
            {"filters": [{"prefix": {"type": ""}}]},
            "bindings[0].filters[0].prefix.type: must not be empty (Knative skips such a filter; "
            'to require that an attribute exists, use filter.attributes with the value "")',
        ),
        (
            {"filters": [{"suffix": {"a-b": "x"}}]},
            f"bindings[0].filters[0].suffix: 'a-b' {_NOT_A_NAME}",
        ),
        ({"filters": [{"any": []}]}, "bindings[0].filters[0].any: must list at least one filter"),
        (
            {"filters": [{"all": {"exact": {"id": "x"}}}]},
            "bindings[0].filters[0].all: must be a list of filters, got mapping",
        ),
        (
            {"filters": [{"not": [{"exact": {"id": "x"}}]}]},
            "bindings[0].filters[0].not: must be a mapping, got list",
        ),
        ({"filters": ["exact"]}, "bindings[0].filters[0]: must be a mapping, got 'exact'"),
    ],
)
def test_filters_refuse_what_knative_would_refuse_or_skip(binding_keys, message) -> None:
    assert binding_error(**binding_keys) == message


def test_a_cesql_filter_is_kept_and_shown_as_written() -> None:
    expression = "type LIKE 'com.example.%' AND (NOT EXISTS region OR region = 'eu')"
    settings = settings_from_dict(
        {"bindings": [binding(filters=[{"not": {"cesql": expression}}])]}, {}
    )
    [entry] = settings.bindings[0].filters
    assert entry == NestingFilter("not", (CesqlFilter(expression),))
    shown = yaml.safe_load(render_effective_config(settings))
    assert shown["bindings"][0]["filters"] == [{"not": {"cesql": expression}}]


def _sink(**overrides: Any) -> dict[str, Any]:
    return binding(dead_letter={"sink": "http://127.0.0.1:1/"}, **overrides)


@pytest.mark.parametrize(
    ("filters", "said"),
    [
        ([{"cesql": "a = 1 OR b = 2 AND c = 3"}], ["bindings[0].filters[0].cesql"]),
        ([{"cesql": "a = 1 OR (b = 2 AND c = 3)"}], []),
        ([{"cesql": "a = 1 AND b = 2 AND c = 3"}], []),
        ([{"cesql": "(a XOR b) OR c"}], []),
        (
            [{"exact": {"a": "1"}}, {"any": [{"exact": {"a": "1"}}, {"cesql": "a XOR b OR c"}]}],
            ["bindings[0].filters[1].any[1].cesql"],
        ),
        ([{"not": {"cesql": "a AND b or c"}}], ["bindings[0].filters[0].not.cesql"]),
    ],
)
def test_check_advises_parentheses_where_knative_reads_cesql_otherwise(filters, said) -> None:
    """Valid, but Knative's filter groups AND/OR/XOR from the right: the same text
    would select other events there."""
    settings = settings_from_dict({"bindings": [_sink(filters=filters)]}, {})
    assert [found.key for found in advice(settings)] == said


def test_check_advises_that_filter_is_ignored_beside_filters() -> None:
    settings = settings_from_dict(
        {"bindings": [_sink(filter={"attributes": {"type": "a"}}, filters=[{"cesql": "true"}])]},
        {},
    )
    assert [str(found) for found in advice(settings)] == [
        "bindings[0].filter: is ignored: filters is set (as in Knative)"
    ]


@pytest.mark.parametrize(
    ("broker_url", "subscriber", "sink", "said"),
    [
        ("amqp://h/%2F", "http://s/", None, ["broker.tls", "bindings[0].tls"]),
        ("amqps://h/%2F", "http://s/", "https://dl/", []),
        (["amqp://a/%2F", "amqps://b/%2F"], "https://s/", None, []),
    ],
)
def test_check_says_tls_files_that_no_url_uses(
    tls_files: dict[str, str], broker_url: Any, subscriber: str, sink: str | None, said: list[str]
) -> None:
    """Given with plain amqp:// and http:// URLs, they are read by nothing."""
    tls = {"ca_file": tls_files["ca.pem"]}
    binding = {"name": "b", "queue": "q", "subscriber": subscriber, "tls": tls}
    binding["dead_letter"] = {"sink": sink} if sink else {"exchange": "dlx"}
    raw = {"broker": {"url": broker_url, "tls": tls}, "bindings": [binding]}
    settings = settings_from_dict(raw, {})
    assert [found.key for found in advice(settings) if found.key.endswith(".tls")] == said


@pytest.mark.parametrize(
    ("delivery", "window", "warned"),
    [
        # 0.8 x (500ms + 1s + 2s) = 2.8 s at the fastest
        ({"retry": 3, "backoff_delay": "500ms"}, "3s", True),
        ({"retry": 3, "backoff_delay": "500ms"}, "2s", False),
        # linear: 0.8 x (1 + 2 + 3 + 4 + 5) s = 12 s
        ({"retry": 5, "backoff_policy": "linear", "backoff_delay": "1s"}, "10s", False),
        # backoff_max caps each wait: 0.8 x (1 + 1 + 1) s = 2.4 s
        ({"retry": 3, "backoff_delay": "1s", "backoff_max": "1s"}, "3s", True),
        ({"retry": 0}, "1s", True),
    ],
)
def test_check_warns_when_retries_run_out_within_the_breakers_window(
    delivery: dict[str, Any], window: str, warned: bool
) -> None:
    breaker = {"window": window}
    settings = settings_from_dict(
        {"bindings": [_sink(delivery=delivery, circuit_breaker=breaker)]}, {}
    )
    said = [found for found in advice(settings) if found.key.endswith("circuit_breaker.window")]
    assert len(said) == (1 if warned else 0)
    if warned:
        assert "messages may be dead-lettered before the breaker opens" in said[0].text


@pytest.mark.parametrize(
    ("keys", "warned"),
    [
        ({"parallelism": 10, "delivery": {"rate_limit": 0.01}}, True),  # 1,000 s
        ({"parallelism": 10, "delivery": {"rate_limit": 0.5}}, False),  # 20 s
        ({"parallelism": 10, "prefetch": 1000, "delivery": {"rate_limit": 1}}, True),
        ({"parallelism": 10}, False),
    ],
)
def test_check_warns_when_a_rate_limit_keeps_messages_unacked_too_long(
    keys: dict[str, Any], warned: bool
) -> None:
    settings = settings_from_dict({"bindings": [_sink(**keys)]}, {})
    said = [a for a in advice(settings) if a.key.endswith("delivery.rate_limit")]
    assert len(said) == (1 if warned else 0)
    if warned:
        assert said[0].key == "bindings[0].delivery.rate_limit"
        assert "consumer_timeout" in said[0].text


@pytest.mark.parametrize(
    ("declare", "warned"),
    [
        ({"type": "quorum", "delivery_limit": 5}, True),
        ({"type": "quorum", "delivery_limit": 5, "dead_letter_exchange": "dlx"}, False),
        ({"type": "quorum"}, False),
        (None, False),
    ],
)
def test_check_warns_when_a_delivery_limit_has_nowhere_to_send_what_reaches_it(
    declare: dict[str, Any] | None, warned: bool
) -> None:
    """The broker discards a message returned ``delivery_limit`` times when the queue
    has no dead-letter exchange, and a binding returns messages (every dead-letter
    target down, shutdown, a lost channel): silently lost, unless said here."""
    settings = settings_from_dict({"bindings": [_sink(declare=declare)]}, {})
    said = [a for a in advice(settings) if a.key.endswith("declare.delivery_limit")]
    assert len(said) == (1 if warned else 0)
    if warned:
        assert said[0].key == "bindings[0].declare.delivery_limit"
        assert "discards a message returned to the queue 5 times" in said[0].text


def test_filters_nest_at_most_32_levels() -> None:
    def nested(levels: int) -> dict[str, Any]:
        entry: dict[str, Any] = {"exact": {"type": "a"}}
        for level in range(levels - 1):
            entry = {"not": entry} if level % 2 else {"all": [entry]}
        return entry

    settings = settings_from_dict({"bindings": [binding(filters=[nested(32)])]}, {})
    assert "exact" in render_effective_config(settings)
    message = binding_error(filters=[nested(500)])
    assert message.endswith(": filters nest at most 32 levels deep")
    assert message.startswith("bindings[0].filters[0].all[0].not.all[0]")


def test_check_shows_headers_but_not_secret_ones() -> None:
    raw = {"name": "b", "queue": "q", "subscriber": "http://h/"}
    raw["headers"] = {"X-Tenant": "blue", "X-Api-Key": "s3cr3t", "X-Version": 2}
    settings = settings_from_dict({"bindings": [raw]}, {})
    assert settings.bindings[0].headers == (
        ("X-Tenant", "blue"),
        ("X-Api-Key", "s3cr3t"),
        ("X-Version", "2"),
    )
    rendered = render_effective_config(settings)
    assert "s3cr3t" not in rendered
    [binding] = yaml.safe_load(rendered)["bindings"]
    assert binding["headers"] == {"X-Tenant": "blue", "X-Api-Key": "<redacted>", "X-Version": "2"}


def test_unknown_nested_key() -> None:
    assert binding_error(delivery={"retires": 3}) == (
        "bindings[0].delivery.retires: unknown key "
        "(expected one of: backoff_delay, backoff_max, backoff_policy, rate_limit, retry, "
        "retry_on, timeout)"
    )


def test_unknown_key_in_broker_tls() -> None:
    message = error_of(broker={"tls": {"ca": "x"}})
    assert message.startswith("broker.tls.ca: unknown key")


def test_integer_given_a_string() -> None:
    assert binding_error(parallelism="ten") == (
        "bindings[0].parallelism: must be an integer, got 'ten'"
    )


def test_integer_given_a_bool() -> None:
    assert binding_error(parallelism=True) == (
        "bindings[0].parallelism: must be an integer, got true"
    )


def test_bool_given_an_int() -> None:
    assert binding_error(ordered=1) == (
        "bindings[0].ordered: must be a boolean (true or false), got 1"
    )


def test_mapping_given_a_list() -> None:
    assert binding_error(delivery=[1, 2]) == "bindings[0].delivery: must be a mapping, got list"


def test_top_level_section_given_a_scalar() -> None:
    assert error_of(logging="debug") == "logging: must be a mapping, got 'debug'"


def test_string_given_a_number() -> None:
    assert binding_error(queue=123) == "bindings[0].queue: must be a string, got 123"


def test_binding_given_a_scalar() -> None:
    assert error_of(bindings=["orders"]) == "bindings[0]: must be a mapping, got 'orders'"


@pytest.mark.parametrize("missing", ["name", "queue", "subscriber"])
def test_required_binding_keys(missing: str) -> None:
    raw = binding()
    del raw[missing]
    assert error_of(bindings=[raw]) == f"bindings[0].{missing}: required"


# --------------------------------------------------------------------------
# Bindings
# --------------------------------------------------------------------------


def test_empty_bindings() -> None:
    assert error_of(bindings=[]) == "bindings: must list at least one binding"


def test_missing_bindings() -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_dict({}, {})
    assert info.value.key == "bindings"


def test_bindings_given_a_mapping() -> None:
    assert error_of(bindings=binding()) == "bindings: must be a list, got mapping"


def test_duplicate_binding_names() -> None:
    message = error_of(bindings=[binding(), binding(queue="other")])
    assert message == "bindings[1].name: duplicate binding name 'orders'"


@pytest.mark.parametrize("name", ["", "has space", "a/b", "x" * 65, "é"])
def test_binding_name_must_be_a_plain_label(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        build(bindings=[binding(name=name)])
    assert info.value.key == "bindings[0].name"


@pytest.mark.parametrize("name", ["orders", "Orders.v2_eu-1", "x" * 64])
def test_binding_name_accepts_plain_labels(name: str) -> None:
    assert build(bindings=[binding(name=name)]).bindings[0].name == name


@pytest.mark.parametrize(
    ("value", "ok"), [(0, False), (1, True), (2000, True), (65535, True), (65536, False)]
)
def test_parallelism_bounds(value: int, ok: bool) -> None:
    # Threads no longer bound it (no thread per delivery); AMQP's prefetch count does.
    if ok:
        assert build(bindings=[binding(parallelism=value)]).bindings[0].parallelism == value
    else:
        assert binding_error(parallelism=value) == (
            "bindings[0].parallelism: must be between 1 and 65535"
        )


def test_ordered_is_allowed_with_any_parallelism() -> None:
    [b] = build(bindings=[binding(ordered=True, parallelism=50)]).bindings
    assert (b.ordered, b.parallelism) == (True, 50)


def test_circuit_breaker_defaults_match_product_md() -> None:
    [b] = build(bindings=[binding(circuit_breaker={})]).bindings
    assert b.circuit_breaker == CircuitBreakerSettings(
        failure_ratio=0.5, min_attempts=20, window=30.0, open_for=30.0, max_open=300.0
    )


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"circuit_breaker": {"failure_ratio": 0}}, "circuit_breaker.failure_ratio: must be > 0"),
        (
            {"circuit_breaker": {"failure_ratio": 1.01}},
            "circuit_breaker.failure_ratio: must be <= 1",
        ),
        (
            {"circuit_breaker": {"failure_ratio": "half"}},
            "circuit_breaker.failure_ratio: must be a number, got 'half'",
        ),
        ({"circuit_breaker": {"min_attempts": 0}}, "circuit_breaker.min_attempts: must be >= 1"),
        ({"circuit_breaker": {"window": "0s"}}, "circuit_breaker.window: must be > 0"),
        (
            {"circuit_breaker": {"open_for": "1m", "max_open": "30s"}},
            "circuit_breaker.max_open: must be >= open_for",
        ),
        ({"delivery": {"rate_limit": 0}}, "delivery.rate_limit: must be > 0"),
        ({"delivery": {"rate_limit": True}}, "delivery.rate_limit: must be a number, got true"),
        ({"delivery": {"rate_limit": "50/s"}}, "delivery.rate_limit: must be a number, got '50/s'"),
        # Read from YAML as floats (.inf, .nan) or an integer no float holds.
        ({"delivery": {"rate_limit": math.inf}}, "delivery.rate_limit: must be a finite number"),
        ({"delivery": {"rate_limit": math.nan}}, "delivery.rate_limit: must be a finite number"),
        ({"delivery": {"rate_limit": 10**400}}, "delivery.rate_limit: must be a finite number"),
        (
            {"circuit_breaker": {"failure_ratio": 10**400}},
            "circuit_breaker.failure_ratio: must be a finite number",
        ),
    ],
)
def test_protection_refused(keys: dict[str, object], error: str) -> None:
    assert binding_error(**keys) == f"bindings[0].{error}"


@pytest.mark.parametrize(
    ("keys", "workers", "held"),
    [
        ({"parallelism": 50}, 50, 50),
        ({"parallelism": 50, "prefetch": 50}, 50, 50),
        ({"parallelism": 50, "prefetch": 200}, 50, 200),
        ({"parallelism": 50, "ordered": True}, 1, 1),
        ({"parallelism": 50, "ordered": True, "prefetch": 1}, 1, 1),
    ],
)
def test_prefetch_is_what_is_held_and_parallelism_what_runs(
    keys: dict[str, object], workers: int, held: int
) -> None:
    [b] = build(bindings=[binding(**keys)]).bindings
    assert (b.effective_parallelism, b.effective_prefetch) == (workers, held)


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        ({"parallelism": 10, "prefetch": 9}, "must be >= parallelism (10), or unset"),
        ({"prefetch": 0}, "must be between 1 and 65535"),
        ({"prefetch": 65536}, "must be between 1 and 65535"),
        ({"prefetch": "20"}, "must be an integer, got '20'"),
        ({"ordered": True, "prefetch": 2}, "must be 1 or unset when ordered is true"),
    ],
)
def test_prefetch_refused(keys: dict[str, object], error: str) -> None:
    assert binding_error(**keys) == f"bindings[0].prefetch: {error}"


@pytest.mark.parametrize(
    ("key", "value"),
    [("content_mode", "json"), ("non_cloudevent", "drop")],
)
def test_binding_enums(key: str, value: str) -> None:
    assert f"bindings[0].{key}: must be one of" in binding_error(**{key: value})


def test_retry_must_not_be_negative() -> None:
    assert binding_error(delivery={"retry": -1}) == "bindings[0].delivery.retry: must be >= 0"


def test_retry_zero_is_allowed() -> None:
    assert build(bindings=[binding(delivery={"retry": 0})]).bindings[0].delivery.retry == 0


def test_backoff_policy_must_be_known() -> None:
    message = binding_error(delivery={"backoff_policy": "random"})
    assert message == (
        "bindings[0].delivery.backoff_policy: must be one of exponential, linear, got 'random'"
    )


def test_timeout_must_be_positive() -> None:
    assert binding_error(delivery={"timeout": 0}) == "bindings[0].delivery.timeout: must be > 0"


def test_backoff_max_must_not_be_below_backoff_delay() -> None:
    message = binding_error(delivery={"backoff_delay": "10s", "backoff_max": "1s"})
    assert message == "bindings[0].delivery.backoff_max: must be >= backoff_delay"


def test_dedupe_window_zero_turns_it_off() -> None:
    assert build(bindings=[binding(dedupe_window=0)]).bindings[0].dedupe_window == 0.0


def test_reply_exchange_and_url_are_exclusive() -> None:
    message = binding_error(reply={"exchange": "replies", "url": "http://ingress/"})
    assert message == "bindings[0].reply: set either exchange or url, not both"


def test_reply_to_the_default_exchange_is_allowed() -> None:
    [b] = build(bindings=[binding(reply={"exchange": "", "routing_key": "replies"})]).bindings
    assert b.reply == ReplySettings(exchange="", routing_key="replies")


def test_dead_letter_sink_and_exchange_may_both_be_set() -> None:
    dead_letter = {"sink": "http://dls/", "exchange": "dlx"}
    [b] = build(bindings=[binding(dead_letter=dead_letter)]).bindings
    assert b.dead_letter == DeadLetterSettings(sink="http://dls/", exchange="dlx")


def test_delivery_limit_needs_quorum() -> None:
    message = binding_error(declare={"type": "classic", "delivery_limit": 5})
    assert message == "bindings[0].declare.delivery_limit: only valid with type: quorum"


def test_delivery_limit_with_quorum() -> None:
    [b] = build(bindings=[binding(declare={"type": "quorum", "delivery_limit": 5})]).bindings
    assert b.declare == DeclareSettings(type="quorum", delivery_limit=5)


def test_delivery_limit_must_be_positive() -> None:
    message = binding_error(declare={"type": "quorum", "delivery_limit": 0})
    assert message == "bindings[0].declare.delivery_limit: must be >= 1"


def test_quorum_queues_must_be_durable() -> None:
    message = binding_error(declare={"type": "quorum", "durable": False})
    assert message == "bindings[0].declare.durable: quorum queues must be durable"


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1, 1),
        ("1024", 1024),
        ("10B", 10),
        ("2KB", 2000),
        ("2KiB", 2048),
        ("3MB", 3_000_000),
        ("8MiB", 8 * 1024 * 1024),
        ("8 mib", 8 * 1024 * 1024),
    ],
)
def test_max_body_size_forms(value: object, size: int) -> None:
    assert build(bindings=[binding(max_body_size=value)]).bindings[0].max_body_size == size


@pytest.mark.parametrize("value", [0, -1, "0MiB", "1GB", "1.5MiB", "lots", True, 1.5])
def test_max_body_size_rejects(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        build(bindings=[binding(max_body_size=value)])
    assert info.value.key == "bindings[0].max_body_size"


# --------------------------------------------------------------------------
# URLs and listen address
# --------------------------------------------------------------------------


def url_config(key: str, url: str) -> dict[str, Any]:
    """Top-level keyword arguments for ``error_of`` that put ``url`` at ``key``."""
    placements: dict[str, dict[str, Any]] = {
        "broker.url": {"broker": {"url": url}},
        "bindings[0].subscriber": {"bindings": [binding(subscriber=url)]},
        "bindings[0].dead_letter.sink": {"bindings": [binding(dead_letter={"sink": url})]},
        "bindings[0].reply.url": {"bindings": [binding(reply={"url": url})]},
    }
    return placements[key]


@pytest.mark.parametrize(
    ("key", "bad", "kind"),
    [
        ("broker.url", "http://rabbit/", "amqp(s)"),
        ("bindings[0].subscriber", "ftp://x", "http(s)"),
        ("bindings[0].dead_letter.sink", "amqp://x/", "http(s)"),
        ("bindings[0].reply.url", "mailto:a@b", "http(s)"),
    ],
)
def test_bad_url_names_the_key(key: str, bad: str, kind: str) -> None:
    assert error_of(**url_config(key, bad)) == f"{key}: must be an {kind} URL, got {bad!r}"


@pytest.mark.parametrize(
    "key",
    [
        "broker.url",
        "bindings[0].subscriber",
        "bindings[0].dead_letter.sink",
        "bindings[0].reply.url",
    ],
)
def test_password_redacted_in_every_url_error(key: str) -> None:
    message = error_of(**url_config(key, "gopher://svc:s3cret@host/"))
    assert "s3cret" not in message
    assert message.startswith(f"{key}: must be an ")
    assert message.endswith("got 'gopher://svc:***@host/'")


def test_subscriber_error_message_is_exact() -> None:
    assert binding_error(subscriber="ftp://x") == (
        "bindings[0].subscriber: must be an http(s) URL, got 'ftp://x'"
    )


@pytest.mark.parametrize("url", ["http://", "http:///path", "https://:80/"])
def test_url_needs_a_host(url: str) -> None:
    assert "with a host" in binding_error(subscriber=url)


@pytest.mark.parametrize(
    "url", ["http://a..b/", "http://example.com/p\u00e4", "http://" + "x" * 64 + ".com/"]
)
def test_url_that_delivery_could_not_use_is_a_config_error(url: str) -> None:
    # `check` said such URLs were valid and `run` then crashed in start-up.
    assert binding_error(subscriber=url).startswith(
        "bindings[0].subscriber: must be an http(s) URL"
    )


# URLs that libcurl would read differently from how config and logs show them.
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://host/a b", "a space"),
        ("http://host/hook#frag", "fragment"),
        ("http://host/100%", "'%' not followed by two hex digits"),
        ("http://host/a\\b", "in the path or query"),
        ("http://host/{x}", "in the path or query"),
        ("http://u:p@ss@host/", "user:password@"),
        ("http://010.0.0.1/", "dotted IPv4"),  # curl: octal, 8.0.0.1
        ("http://2130706433/", "dotted IPv4"),  # curl: 127.0.0.1
        ("http://0x7f.1/", "dotted IPv4"),
        ("http://h\\evil.example/", "DNS name"),
        ("http://host:/", "port must be digits"),
    ],
)
@pytest.mark.parametrize(
    "key", ["bindings[0].subscriber", "bindings[0].dead_letter.sink", "bindings[0].reply.url"]
)
def test_url_libcurl_would_read_differently_is_refused_by_check(
    key: str, url: str, why: str
) -> None:
    message = error_of(**url_config(key, url))
    assert message.startswith(f"{key}: must be an http(s) URL as RFC 3986 writes it: ")
    assert why in message


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/",
        "https://svc.ns.svc.cluster.local./events?x=1&y=%2F",
        "http://user%40corp:p%2Fss@ingress/",
        "http://[::1]:9/",
        "http://my_service:8080/a/b;c=d",
    ],
)
def test_well_formed_urls_pass(url: str) -> None:
    settings = build(bindings=[binding(subscriber=url)])
    assert settings.bindings[0].subscriber == url


def test_url_with_bad_port() -> None:
    with pytest.raises(ConfigError) as info:
        build(bindings=[binding(subscriber="http://host:99999/")])
    assert info.value.key == "bindings[0].subscriber"


@pytest.mark.parametrize(
    ("listen", "host", "port"),
    [
        ("0.0.0.0:9090", "0.0.0.0", 9090),
        (":8080", "0.0.0.0", 8080),
        ("localhost:1", "localhost", 1),
        ("[::]:9090", "::", 9090),
        ("[::1]:65535", "::1", 65535),
    ],
)
def test_listen_forms(listen: str, host: str, port: int) -> None:
    http = build(http={"listen": listen}).http
    assert (http.listen, http.host, http.port) == (listen, host, port)


@pytest.mark.parametrize(
    "listen",
    [
        "9090",
        "host:65536",
        "host:http",
        "::1:9090",
        "[::1]",
        "[::1]9090",
        9090,
        " 127.0.0.1:9090",  # run could not resolve " 127.0.0.1"
        "http://0.0.0.0:9090",
    ],
)
def test_listen_rejects(listen: object) -> None:
    with pytest.raises(ConfigError) as info:
        build(http={"listen": listen})
    assert info.value.key == "http.listen"


# --------------------------------------------------------------------------
# TLS files
# --------------------------------------------------------------------------


def test_tls_file_must_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    message = error_of(broker={"tls": {"ca_file": missing}})
    assert message == f"broker.tls.ca_file: file not found: {missing}"


def test_a_directory_given_as_a_file_is_called_a_directory(tmp_path: Path) -> None:
    message = error_of(broker={"tls": {"ca_file": str(tmp_path)}})
    assert message == f"broker.tls.ca_file: is a directory, not a file: {tmp_path}"


def test_tls_cert_without_key(tls_files: dict[str, str]) -> None:
    message = binding_error(tls={"cert_file": tls_files["cert.pem"]})
    assert message == "bindings[0].tls.key_file: required when cert_file is set"


def test_tls_key_without_cert(tls_files: dict[str, str]) -> None:
    message = error_of(broker={"tls": {"key_file": tls_files["key.pem"]}})
    assert message == "broker.tls.cert_file: required when key_file is set"


# --------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert str(info.value) == f"config: file not found: {path}"


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broker:\n  url: amqp://x/\n  heartbeat: [unclosed\nhttp: {}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    message = str(info.value)
    assert path in message
    assert "line 4" in message


def test_duplicate_yaml_keys_are_errors(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "logging: {level: info}\nlogging: {level: debug}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert "duplicate key 'logging'" in str(info.value)
    assert "line 6" in str(info.value)


def test_yaml_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = MINIMAL + "    delivery: {<<: {retry: 1, timeout: 2s}, retry: 3}\n"
    settings = load_settings(write(tmp_path, text), {})
    assert settings.bindings[0].delivery.retry == 3
    assert settings.bindings[0].delivery.timeout == 2.0


@pytest.mark.parametrize(("text", "got"), [("- a\n- b\n", "list"), ("just text\n", "'just text'")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, got: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert str(info.value) == f"config: {path}: top level must be a mapping, got {got}"


def test_empty_file(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    with pytest.raises(ConfigError, match="is empty"):
        load_settings(path, {})


def test_dispatcher_config_selects_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL.replace("orders", "from-env"), "env.yaml")
    settings = load_settings(None, {"DISPATCHER_CONFIG": path})
    assert settings.bindings[0].name == "from-env"


def test_explicit_path_beats_dispatcher_config(tmp_path: Path) -> None:
    explicit = write(tmp_path, MINIMAL.replace("orders", "explicit"), "explicit.yaml")
    from_env = write(tmp_path, MINIMAL.replace("orders", "from-env"), "env.yaml")
    settings = load_settings(explicit, {"DISPATCHER_CONFIG": from_env})
    assert settings.bindings[0].name == "explicit"


def test_missing_dispatcher_config_file_names_the_variable(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as info:
        load_settings(None, {"DISPATCHER_CONFIG": path})
    assert str(info.value) == f"DISPATCHER_CONFIG: file not found: {path}"


def test_default_path_is_config_dispatcher_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config").mkdir()
    write(tmp_path / "config", MINIMAL.replace("orders", "default"))
    monkeypatch.chdir(tmp_path)
    assert load_settings(None, {}).bindings[0].name == "default"


def test_default_path_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_settings(None, {})
    assert str(info.value) == "config: file not found: config/dispatcher.yaml"


# --------------------------------------------------------------------------
# Environment overrides
# --------------------------------------------------------------------------


def test_env_overrides_all_four(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "logging: {level: info, format: json}\n")
    environ = {
        "RABBITMQ_URL": "amqps://svc:pw@rabbit.prod:5671/v",
        "DISPATCHER_LISTEN": "127.0.0.1:9999",
        "LOG_LEVEL": "WARNING",
        "LOG_FORMAT": "console",
    }
    settings = load_settings(path, environ)
    assert settings.broker.url == "amqps://svc:pw@rabbit.prod:5671/v"
    assert settings.http.port == 9999
    assert settings.logging == LoggingSettings(level="warning", format="console")


def test_env_overrides_keep_the_rest_of_the_section() -> None:
    settings = build({"RABBITMQ_URL": "amqp://rabbit/"}, broker={"heartbeat": "5s"})
    assert (settings.broker.url, settings.broker.heartbeat) == ("amqp://rabbit/", 5.0)


def test_empty_env_variable_counts_as_unset() -> None:
    assert build({"LOG_LEVEL": ""}, logging={"level": "error"}).logging.level == "error"


def test_log_level_warn_alias() -> None:
    assert build({"LOG_LEVEL": "warn"}).logging.level == "warning"


def test_invalid_env_value_names_the_variable() -> None:
    assert error_of({"LOG_FORMAT": "xml"}) == "LOG_FORMAT: must be one of json, console, got 'xml'"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("LOG_LEVEL", "loud"), ("DISPATCHER_LISTEN", "nowhere"), ("RABBITMQ_URL", "http://x/")],
)
def test_each_invalid_env_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        build({variable: value})
    assert info.value.key == variable


def test_invalid_file_value_still_names_the_key() -> None:
    assert error_of(logging={"format": "xml"}) == (
        "logging.format: must be one of json, console, got 'xml'"
    )


# --------------------------------------------------------------------------
# Passwords
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("amqp://guest:guest@localhost:5672/%2F", "amqp://guest:***@localhost:5672/%2F"),
        ("amqps://u:p%40ss@host/", "amqps://u:***@host/"),
        ("amqp://u:p@ss#w?rd@host/v", "amqp://u:***@host/v"),
        ("http://:token@host/", "http://:***@host/"),
        ("http://user@host/", "http://user@host/"),
        ("http://host:8080/a", "http://host:8080/a"),
        ("amqp://localhost", "amqp://localhost"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_password_redacted_in_effective_config() -> None:
    settings = build(
        {"RABBITMQ_URL": "amqp://svc:s3cret@rabbit/"},
        bindings=[binding(subscriber="https://hook:h00k@sub.example/")],
    )
    broker = effective_config(settings)["broker"]
    assert isinstance(broker, dict)
    assert broker["url"] == "amqp://svc:***@rabbit/"
    rendered = render_effective_config(settings)
    assert "s3cret" not in rendered
    assert "h00k" not in rendered
    assert "amqp://svc:***@rabbit/" in rendered
    assert "https://hook:***@sub.example/" in rendered
    # The settings themselves keep the real URL: the broker module needs it.
    assert settings.broker.url == "amqp://svc:s3cret@rabbit/"


def test_password_redacted_in_url_errors() -> None:
    message = error_of(broker={"url": "http://svc:s3cret@rabbit/"})
    assert message == "broker.url: must be an amqp(s) URL, got 'http://svc:***@rabbit/'"


def test_password_redacted_in_env_url_errors() -> None:
    message = error_of({"RABBITMQ_URL": "rabbit://svc:s3cret@host/"})
    assert message == "RABBITMQ_URL: must be an amqp(s) URL, got 'rabbit://svc:***@host/'"


def test_password_redacted_when_a_url_lands_in_the_wrong_place() -> None:
    message = error_of(broker="amqp://svc:s3cret@rabbit/")
    assert "s3cret" not in message
    assert message == "broker: must be a mapping, got 'amqp://svc:***@rabbit/'"


def test_password_redacted_in_yaml_errors(tmp_path: Path) -> None:
    path = write(tmp_path, "broker:\n  url: amqp://svc:s3cret@rabbit/\n  url: again\n" + MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_settings(path, {})
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("0s", "must be at least 1s"),
        (0, "must be at least 1s"),
        ("400ms", "must be at least 1s"),
        ("70000s", "must be at most 65535s"),
    ],
)
def test_heartbeat_bounds(value, problem):
    assert error_of(broker={"heartbeat": value}).startswith("broker.heartbeat: " + problem)
    assert build(broker={"heartbeat": "1s"}).broker.heartbeat == 1.0


def test_backoff_delay_zero_is_refused() -> None:
    # The requeue wait is the backoff: 0 would loop a refused message hot.
    assert binding_error(delivery={"backoff_delay": "0s"}) == (
        "bindings[0].delivery.backoff_delay: must be > 0"
    )


def test_batch_settings_check_only_the_sections_a_command_uses(tmp_path) -> None:
    """report never connects: a broker setting it cannot use must not stop it."""
    path = tmp_path / "dispatcher.yaml"
    path.write_text("broker: {tls: {ca_file: /nonexistent/ca.pem}}\nlogging: {level: warning}\n")
    environ = {"RABBITMQ_URL": "not a url"}
    only_logging = load_batch_settings(str(path), environ, ("logging",))
    assert only_logging.logging.level == "warning"
    assert only_logging.broker == BrokerSettings()
    with pytest.raises(ConfigError) as caught:
        load_batch_settings(str(path), environ)
    assert caught.value.key == "RABBITMQ_URL"


# --------------------------------------------------------------------------
# A fleet: cluster nodes and the shared dedupe store
# --------------------------------------------------------------------------


def test_broker_url_may_list_the_nodes_of_a_cluster() -> None:
    nodes = ["amqp://u:p@rabbit-0:5672/v", "amqp://u:p@rabbit-1:5672/v"]
    settings = build(broker={"url": nodes})
    assert settings.broker.url == tuple(nodes)
    assert settings.broker.urls == tuple(nodes)
    assert build(broker={"url": nodes[:1]}).broker.url == nodes[0]  # a list of one: one URL
    assert build().broker.urls == ("amqp://guest:guest@localhost:5672/%2F",)
    rendered = yaml.safe_load(render_effective_config(settings))
    assert rendered["broker"]["url"] == [
        "amqp://u:***@rabbit-0:5672/v",
        "amqp://u:***@rabbit-1:5672/v",
    ]


def test_rabbitmq_url_separates_nodes_with_commas_but_not_inside_a_password() -> None:
    environ = {"RABBITMQ_URL": "amqp://u:p,w@a:5672/v , AMQPS://u:p,w@b:5671/v"}
    assert build(environ).broker.url == ("amqp://u:p,w@a:5672/v", "AMQPS://u:p,w@b:5671/v")
    assert build({"RABBITMQ_URL": "amqp://u:a,b@h:5672/v"}).broker.url == "amqp://u:a,b@h:5672/v"


@pytest.mark.parametrize(
    ("environ", "broker", "message"),
    [
        ({}, {"url": []}, "broker.url: must name at least one node"),
        (
            {},
            {"url": ["amqp://h/", "http://h/"]},
            "broker.url[1]: must be an amqp(s) URL, got 'http://h/'",
        ),
        (
            {"RABBITMQ_URL": "amqp://h/, amqp://u:s3cret@"},
            {},
            "RABBITMQ_URL: must be an amqp(s) URL with a host, got 'amqp://u:***@'",
        ),
    ],
)
def test_bad_cluster_urls(environ, broker, message) -> None:
    assert error_of(environ, broker=broker) == message


def test_dedupe_store_from_the_file_or_dedupe_store_url() -> None:
    assert build().dedupe.store is None
    assert build(dedupe={"store": "redis://r:6379/2"}).dedupe.store == "redis://r:6379/2"
    settings = build({"DEDUPE_STORE_URL": "rediss://:pw-s3cret@r:6380/0"})
    assert settings.dedupe.store == "rediss://:pw-s3cret@r:6380/0"
    rendered = render_effective_config(settings)
    assert "pw-s3cret" not in rendered
    assert yaml.safe_load(rendered)["dedupe"] == {"store": "rediss://:***@r:6380/0"}


@pytest.mark.parametrize(
    ("environ", "dedupe", "message"),
    [
        ({}, {"store": "http://r/"}, "dedupe.store: must be a redis(s) URL, got 'http://r/'"),
        (
            {},
            {"store": "redis://r/db"},
            "dedupe.store: the path must be a database number, got 'redis://r/db'",
        ),
        (
            {"DEDUPE_STORE_URL": "redis://:pw@"},
            {},
            "DEDUPE_STORE_URL: must be a redis(s) URL with a host, got 'redis://:***@'",
        ),
        ({}, {"stor": None}, "dedupe.stor: unknown key (expected one of: store)"),
    ],
)
def test_bad_dedupe_store(environ, dedupe, message) -> None:
    assert error_of(environ, dedupe=dedupe) == message
