"""What every key of the configuration accepts, as data, and the rules between keys.

``_RULES`` gives each settings dataclass's fields their ``Rule`` (parser and
JSON Schema); ``_CHECKS`` gives a section the checks that span its fields (a
cluster's nodes share one virtual host, ``max_delay >= initial_delay``, one
source of ``Authorization`` per binding...). ``build`` reads a section with
both. Fields are read in declaration order, so the first bad key in the file's
own order is the one reported.

``schema`` turns the same table into the Helm chart's JSON Schema.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from functools import partial
from typing import Any, Final, TypeVar, get_args
from urllib.parse import urlsplit

from dispatcher.config import amqp, durations, urls, values
from dispatcher.config.redaction import show
from dispatcher.config.settings import (
    AttributesFilter,
    AuthSettings,
    BackoffPolicy,
    BatchSettings,
    BindingSettings,
    BrokerSettings,
    CircuitBreakerSettings,
    ContentMode,
    DeadLetterSettings,
    DeclareSettings,
    DedupeSettings,
    DeliverySettings,
    HttpSettings,
    LogFormat,
    LoggingSettings,
    LogLevel,
    NonCloudEvent,
    QueueType,
    ReconnectSettings,
    ReplySettings,
    Settings,
    ShutdownSettings,
    TlsSettings,
    TracingSettings,
)
from dispatcher.config.validation import (
    FILE_RULE,
    ListRule,
    Rule,
    Section,
    SectionRule,
    attributes_schema,
    choice_rule,
    duration_rule,
    filter_entry_schema,
    integer_rule,
    number_rule,
    size_rule,
    text_rule,
    url_list_rule,
    url_rule,
)
from dispatcher.errors import ConfigError

T = TypeVar("T")


def build(shape: type[T], raw: object, key: str) -> T:
    """A section: each field read by its rule in ``_RULES``, then the checks that
    span fields (``_CHECKS``)."""
    assert is_dataclass(shape)
    s = Section(raw, key, shape)
    rules = _RULES[shape]
    read = {f.name: rules[f.name].read(s, f) for f in fields(shape)}
    built = shape(**read)
    check = _CHECKS.get(shape)
    if check is not None:
        check(built, s)
    return built


def rule_table() -> Mapping[type, Mapping[str, Rule]]:
    """Every section's rules, for ``schema``."""
    return _RULES


def _section_rule(shape: type) -> SectionRule:
    return SectionRule(partial(build, shape), {}, shape)


def _bindings(raw: object, key: str) -> tuple[BindingSettings, ...]:
    if raw is None:
        raise ConfigError(key, "required: list at least one binding")
    if not isinstance(raw, list):
        raise ConfigError(key, f"must be a list, got {show(raw)}")
    if not raw:
        raise ConfigError(key, "must list at least one binding")
    bindings = tuple(build(BindingSettings, item, f"{key}[{i}]") for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, binding in enumerate(bindings):
        if binding.name in seen:
            raise ConfigError(f"{key}[{i}].name", f"duplicate binding name {binding.name!r}")
        seen.add(binding.name)
    return bindings


def _bindings_rule() -> ListRule:
    schema = {"type": "array", "minItems": 1}
    return ListRule(_bindings, schema, _section_rule(BindingSettings))


# --------------------------------------------------------------------------
# Checks that span the fields of one section
# --------------------------------------------------------------------------


def _check_broker(broker: Any, s: Section) -> None:
    if len({amqp.virtual_host(url) for url in broker.urls}) > 1:
        raise ConfigError(s.sub("url"), "every node of one cluster must name the same virtual host")


def _check_reconnect(reconnect: Any, s: Section) -> None:
    if reconnect.max_delay < reconnect.initial_delay:
        raise ConfigError(s.sub("max_delay"), "must be >= initial_delay")


def _check_tls(tls: Any, s: Section) -> None:
    if tls.cert_file is not None and tls.key_file is None:
        raise ConfigError(s.sub("key_file"), "required when cert_file is set")
    if tls.key_file is not None and tls.cert_file is None:
        raise ConfigError(s.sub("cert_file"), "required when key_file is set")


def _check_declare(declare: Any, s: Section) -> None:
    # RabbitMQ refuses both; failing here beats a channel error at startup.
    if declare.type == "quorum" and not declare.durable:
        raise ConfigError(s.sub("durable"), "quorum queues must be durable")
    if declare.delivery_limit is not None and declare.type != "quorum":
        raise ConfigError(s.sub("delivery_limit"), "only valid with type: quorum")


def _check_delivery(delivery: Any, s: Section) -> None:
    if delivery.backoff_max < delivery.backoff_delay:
        raise ConfigError(s.sub("backoff_max"), "must be >= backoff_delay")


def _check_binding(binding: Any, s: Section) -> None:
    _check_prefetch(binding, s)
    _check_authorization(binding, s)


def _check_prefetch(binding: Any, s: Section) -> None:
    if binding.prefetch is None:
        return
    if binding.ordered and binding.prefetch != 1:
        # A message waiting behind one being retried would be settled before it
        # if that one went back to the queue.
        raise ConfigError(s.sub("prefetch"), "must be 1 or unset when ordered is true")
    if not binding.ordered and binding.prefetch < binding.parallelism:
        raise ConfigError(
            s.sub("prefetch"), f"must be >= parallelism ({binding.parallelism}), or unset"
        )


def _check_authorization(binding: Any, s: Section) -> None:
    """One source of ``Authorization`` per binding: a URL's ``user:password@`` (Basic),
    ``auth`` (Bearer) or ``headers``; two would replace each other without a word."""
    addresses = {
        "subscriber": binding.subscriber,
        "dead_letter.sink": binding.dead_letter.sink,
        "reply.url": binding.reply.url,
    }
    with_userinfo = [
        key for key, url in addresses.items() if url and urlsplit(url).username is not None
    ]
    if binding.auth.bearer_token_file is not None and with_userinfo:
        raise ConfigError(
            s.sub("auth.bearer_token_file"),
            f"conflicts with the user:password@ of {with_userinfo[0]} (sent as Basic auth)",
        )
    if any(name.lower() == "authorization" for name, _ in binding.headers):
        if binding.auth.bearer_token_file is not None:
            raise ConfigError(
                s.sub("headers.Authorization"), "conflicts with auth.bearer_token_file"
            )
        if with_userinfo:
            raise ConfigError(
                s.sub("headers.Authorization"),
                f"conflicts with the user:password@ of {with_userinfo[0]} (sent as Basic auth)",
            )


def _check_circuit_breaker(breaker: Any, s: Section) -> None:
    if breaker.max_open < breaker.open_for:
        raise ConfigError(s.sub("max_open"), "must be >= open_for")


def _check_reply(reply: Any, s: Section) -> None:
    if reply.exchange is not None and reply.url is not None:
        raise ConfigError(s.key, "set either exchange or url, not both")


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------

_LOG_LEVEL_ALIASES: Final[Mapping[str, LogLevel]] = {
    "warn": "warning"
}  # what LOG_LEVEL=warn means everywhere else
_TLS: Final = _section_rule(TlsSettings)
_HTTP_URL: Final = url_rule(urls.http_url, "http", "https")

_RULES: Final[Mapping[type, Mapping[str, Rule]]] = {
    Settings: {
        "broker": _section_rule(BrokerSettings),
        "http": _section_rule(HttpSettings),
        "shutdown": _section_rule(ShutdownSettings),
        "logging": _section_rule(LoggingSettings),
        "dedupe": _section_rule(DedupeSettings),
        "tracing": _section_rule(TracingSettings),
        "bindings": _bindings_rule(),
    },
    BatchSettings: {
        "broker": _section_rule(BrokerSettings),
        "logging": _section_rule(LoggingSettings),
    },
    BrokerSettings: {
        "url": url_list_rule(urls.amqp_urls, "amqp", "amqps"),
        "heartbeat": duration_rule(durations.heartbeat, 1, maximum=65535),
        "connection_name": text_rule(non_empty=True),
        "tls": _TLS,
        "reconnect": _section_rule(ReconnectSettings),
        "blocked_timeout": duration_rule(durations.positive_duration, 0, positive=True),
    },
    DedupeSettings: {"store": url_rule(urls.redis_url, "redis", "rediss")},
    TracingSettings: {
        "enabled": Rule(values.boolean, {"type": "boolean"}),
        "endpoint": _HTTP_URL,
        "sample_ratio": number_rule(0.0, 1.0),
        "service_name": text_rule(non_empty=True),
    },
    TlsSettings: {"ca_file": FILE_RULE, "cert_file": FILE_RULE, "key_file": FILE_RULE},
    AttributesFilter: {
        "attributes": Rule(values.filter_attributes, attributes_schema(non_empty=False))
    },
    AuthSettings: {
        "bearer_token_file": Rule(values.token_file, {"type": "string", "minLength": 1})
    },
    ReconnectSettings: {
        # Exponential backoff from 0 stays at 0: a tight reconnect loop.
        "initial_delay": duration_rule(durations.positive_duration, 0, positive=True),
        "max_delay": duration_rule(durations.parse_duration, 0),
    },
    HttpSettings: {
        "listen": Rule(
            values.listen, {"type": "string", "pattern": r"^(\[[^\]]+\]|[^:\[][^:]*|):[0-9]+$"}
        )
    },
    ShutdownSettings: {"grace": duration_rule(durations.parse_duration, 0)},
    LoggingSettings: {
        "level": choice_rule(get_args(LogLevel), lower=True, aliases=_LOG_LEVEL_ALIASES),
        "format": choice_rule(get_args(LogFormat), lower=True),
    },
    BindingSettings: {
        "name": Rule(
            values.binding_name, {"type": "string", "pattern": f"^{values.BINDING_NAME.pattern}$"}
        ),
        "queue": text_rule(non_empty=True, max_bytes=255),  # AMQP 0-9-1 shortstr limit
        "subscriber": _HTTP_URL,
        "declare": _section_rule(DeclareSettings),
        "content_mode": choice_rule(get_args(ContentMode)),
        "tls": _TLS,
        # The prefetch count is an AMQP short (and 0 would mean "unlimited").
        "parallelism": integer_rule(1, 65535),
        "prefetch": integer_rule(1, 65535),
        "ordered": Rule(values.boolean, {"type": "boolean"}),
        "delivery": _section_rule(DeliverySettings),
        "circuit_breaker": _section_rule(CircuitBreakerSettings),
        "auth": _section_rule(AuthSettings),
        "headers": Rule(
            values.headers,
            {
                "type": "object",
                "propertyNames": {
                    "pattern": f"^{values.HEADER_NAME.pattern}$",
                    "not": {"pattern": "^([cC][eE]-|[cC][oO][nN][tT][eE][nN][tT]-)"},
                },
                "additionalProperties": {
                    "anyOf": [
                        {"type": "string", "pattern": f"^{values.HEADER_VALUE.pattern}$"},
                        {"type": "integer"},
                    ]
                },
            },
        ),
        "filter": _section_rule(AttributesFilter),
        "filters": Rule(values.filters, {"type": "array", "items": filter_entry_schema()}),
        "dedupe_window": duration_rule(durations.parse_duration, 0),
        "dead_letter": _section_rule(DeadLetterSettings),
        "reply": _section_rule(ReplySettings),
        "non_cloudevent": choice_rule(get_args(NonCloudEvent)),
        "max_body_size": size_rule(),
    },
    DeclareSettings: {
        "durable": Rule(values.boolean, {"type": "boolean"}),
        "type": choice_rule(get_args(QueueType)),
        "dead_letter_exchange": text_rule(),
        "delivery_limit": integer_rule(1),
    },
    DeliverySettings: {
        "retry": integer_rule(0),
        "backoff_policy": choice_rule(get_args(BackoffPolicy)),
        # 0 would requeue a refused message straight back, in a hot loop.
        "backoff_delay": duration_rule(durations.positive_duration, 0, positive=True),
        "backoff_max": duration_rule(durations.parse_duration, 0),
        "timeout": duration_rule(durations.positive_duration, 0, positive=True),
        "retry_on": Rule(
            values.retry_on,
            {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "type": "integer",
                            "minimum": 100,
                            "maximum": 599,
                            "not": {"minimum": 200, "maximum": 299},
                        },
                        {"type": "string", "pattern": "^(1[0-9]{2}|[3-5][0-9]{2}|[45][xX][xX])$"},
                    ]
                },
            },
        ),
        "rate_limit": number_rule(0.0, 1_000_000.0, low_open=True),
    },
    CircuitBreakerSettings: {
        "failure_ratio": number_rule(0.0, 1.0, low_open=True),
        "min_attempts": integer_rule(1),
        "window": duration_rule(durations.positive_duration, 0, positive=True),
        "open_for": duration_rule(durations.positive_duration, 0, positive=True),
        "max_open": duration_rule(durations.positive_duration, 0, positive=True),
    },
    DeadLetterSettings: {"sink": _HTTP_URL, "exchange": text_rule(), "routing_key": text_rule()},
    ReplySettings: {"exchange": text_rule(), "routing_key": text_rule(), "url": _HTTP_URL},
}

_CHECKS: Final[Mapping[type, Callable[[Any, Section], None]]] = {
    BrokerSettings: _check_broker,
    ReconnectSettings: _check_reconnect,
    TlsSettings: _check_tls,
    DeclareSettings: _check_declare,
    DeliverySettings: _check_delivery,
    ReplySettings: _check_reply,
    CircuitBreakerSettings: _check_circuit_breaker,
    BindingSettings: _check_binding,
}
