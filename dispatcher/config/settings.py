"""The settings tree: every key of the configuration, declared once, as pydantic models.

``Settings`` is the service's whole configuration; ``BatchSettings`` is the part
the batch commands read. A field is one key: its name, its type, what it
accepts (the ``Accepts`` marker in its annotation: our parser, its JSON Schema
and how ``check`` writes it back; ``validation``), its default (the value a
missing key or ``null`` means) and its description. The checks that span the
keys of one section are that section's ``after`` validators. A key that takes
one of a closed set of words has a ``Literal`` type listing them
(``ContentMode``, ``BackoffPolicy``...), in the order messages list them.

Nothing here connects: the broker and HTTP sides turn these into sockets and
TLS contexts. ``sources`` fills the tree, ``problems`` words its errors.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import (
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    model_validator,
)

from dispatcher.config import durations, values
from dispatcher.config.filter_tree import FilterEntry
from dispatcher.config.redaction import show
from dispatcher.config.urls import amqp_urls, http_url, redis_url
from dispatcher.config.validation import (
    FILE,
    Accepts,
    attributes_schema,
    checked,
    choice,
    duration,
    refuse,
    size,
    url_list,
)
from dispatcher.config.validation import url as url_of
from dispatcher.delivery.retry import DEFAULT_RETRY_ON, BackoffPolicy

# The closed sets: the words a key accepts, in the order messages list them.
ContentMode = Literal["binary", "structured"]
NonCloudEvent = Literal["wrap", "dead_letter"]
QueueType = Literal["classic", "quorum"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "console"]

# The longest this process keeps a message unacked on purpose (a hold in an
# open circuit breaker, a wait for a rate-limit slot): half the broker's default
# consumer_timeout (30 min), past which the broker closes the channel and
# requeues everything on it.
UNACKED_MAX: Final = 15 * 60.0

# What the keys accept, where more than one key accepts the same.
_POSITIVE_DURATION: Final = duration(durations.positive_duration, 0, positive=True)
_DURATION: Final = duration(durations.parse_duration, 0)
_HTTP_URL: Final = url_of(http_url, "http", "https")
# The prefetch count is an AMQP short (and 0 would mean "unlimited").
AmqpShort = Annotated[int, Strict(), Field(ge=1, le=65535)]
NonEmptyText = Annotated[str, Strict(), Field(min_length=1)]
# At most 255 bytes (the AMQP 0-9-1 shortstr limit): bytes, which pydantic does not count.
_QUEUE: Final = Accepts(values.queue_name, {"type": "string", "minLength": 1, "maxLength": 255})


class Section(BaseModel):
    """One mapping of the file: only its declared keys, ``null`` meaning the default."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    @model_validator(mode="before")
    @classmethod
    def _read(cls, raw: object) -> object:
        if isinstance(raw, BaseModel):
            return raw
        section = checked(values.mapping, raw)  # absent or null: every default
        # null means "use the default": Helm templates render unset values as null.
        keys = cls.model_fields
        return {k: value for k, value in section.items() if value is not None or k not in keys}


class TlsSettings(Section):
    """PEM files: the CAs to trust (else the system's) and a client certificate."""

    ca_file: Annotated[str | None, FILE] = Field(default=None, description="CA bundle to trust")
    cert_file: Annotated[str | None, FILE] = Field(default=None, description="Client certificate")
    key_file: Annotated[str | None, FILE] = Field(default=None, description="Its private key")

    @model_validator(mode="after")
    def _pairs(self) -> Self:
        if self.cert_file is not None and self.key_file is None:
            refuse("key_file", "required when cert_file is set")
        if self.key_file is not None and self.cert_file is None:
            refuse("cert_file", "required when key_file is set")
        return self


class ReconnectSettings(Section):
    """How the broker side waits between attempts to reconnect."""

    # Exponential backoff from 0 stays at 0: a tight reconnect loop.
    initial_delay: Annotated[float, _POSITIVE_DURATION] = Field(
        default=0.2, description="First wait before reconnecting; doubles, with jitter"
    )
    max_delay: Annotated[float, _DURATION] = Field(default=30.0, description="Longest wait")

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max_delay < self.initial_delay:
            refuse("max_delay", "must be >= initial_delay")
        return self


class BrokerSettings(Section):
    """The RabbitMQ node (or cluster) the bindings consume from and publish to."""

    url: Annotated[str | tuple[str, ...], url_list(amqp_urls, "amqp", "amqps")] = Field(
        default="amqp://guest:guest@localhost:5672/%2F",
        description="One node's URL, or a cluster's nodes (a list, or comma-separated)",
    )
    heartbeat: Annotated[float, duration(durations.heartbeat, 1, maximum=65535)] = Field(
        default=20.0, description="AMQP heartbeat: a silent connection is dropped after 2 of them"
    )
    connection_name: NonEmptyText = Field(
        default="dispatcher", description="Shown in the management UI"
    )
    tls: TlsSettings = Field(default_factory=TlsSettings)
    reconnect: ReconnectSettings = Field(default_factory=ReconnectSettings)
    blocked_timeout: Annotated[float, _POSITIVE_DURATION] = Field(
        default=60.0, description="A broker blocking publishes this long drops the connection"
    )

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node's URL, in the order given."""
        return (self.url,) if isinstance(self.url, str) else self.url

    @property
    def uses_tls(self) -> bool:
        """Some node is reached over TLS (``amqps://``, or pika's ``ssl_options``)."""
        return any(url.lower().startswith("amqps://") or "ssl_options" in url for url in self.urls)


class DedupeSettings(Section):
    """Duplicate suppression shared by the replicas of one fleet."""

    store: Annotated[str | None, url_of(redis_url, "redis", "rediss")] = Field(
        default=None,
        description="redis:// or rediss://: claims shared by every replica; "
        "unset keeps duplicate suppression in this process's memory",
    )


_LISTEN: Final = Accepts(
    values.listen, {"type": "string", "pattern": r"^(\[[^\]]+\]|[^:\[][^:]*|):[0-9]+$"}
)


class HttpSettings(Section):
    """The operations server: /metrics, /healthz, /readyz."""

    listen: Annotated[str, _LISTEN] = Field(
        default="0.0.0.0:9090", description="Metrics and probes: host:port, IPv6 in brackets"
    )

    @property
    def host(self) -> str:
        return values.split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return values.split_listen(self.listen)[1]


class ShutdownSettings(Section):
    """What SIGTERM leaves time for."""

    grace: Annotated[float, _DURATION] = Field(
        default=25.0, description="After SIGTERM, in-flight work gets this long"
    )


# What LOG_LEVEL=warn means everywhere else.
_LOG_LEVEL: Final = choice(get_args(LogLevel), aliases={"warn": "warning"})


class LoggingSettings(Section):
    """Log lines on stdout."""

    level: Annotated[LogLevel, _LOG_LEVEL] = Field(
        default="info", description="debug, info, warning (or warn) or error; any case"
    )
    format: Annotated[LogFormat, choice(get_args(LogFormat))] = Field(
        default="json", description="json (one object per line) or console"
    )


class TracingSettings(Section):
    """OpenTelemetry spans over OTLP/HTTP. The standard OTEL_* variables override
    these keys, and the exporter reads the rest of them itself (headers, resource
    attributes, a signal-specific endpoint)."""

    # ``config/otel.py`` applies the OTEL_* overrides.

    enabled: StrictBool = Field(
        default=False, description="Export a span per delivery, per HTTP attempt and per publish"
    )
    endpoint: Annotated[str, _HTTP_URL] = Field(
        default="http://127.0.0.1:4318",
        description="The collector's base URL: /v1/traces is appended, "
        "as for OTEL_EXPORTER_OTLP_ENDPOINT",
    )
    sample_ratio: Annotated[float, Strict(), AllowInfNan(False), Field(ge=0.0, le=1.0)] = Field(
        default=1.0,
        description="Parent-based: a sampled parent is always followed, one that is not never",
    )
    service_name: NonEmptyText = Field(
        default="dispatcher", description="service.name of the spans (OTEL_SERVICE_NAME wins)"
    )

    @property
    def traces_url(self) -> str:
        return self.endpoint.rstrip("/") + "/v1/traces"


class DeclareSettings(Section):
    """Declare the queue at start (unset: it must exist)."""

    durable: StrictBool = Field(
        default=True, description="Survives a broker restart (quorum queues must be)"
    )
    type: QueueType = Field(default="classic", description="classic or quorum")
    dead_letter_exchange: StrictStr | None = Field(
        default=None, description="The queue's x-dead-letter-exchange"
    )
    delivery_limit: Annotated[int, Strict(), Field(ge=1)] | None = Field(
        default=None,
        description="Quorum queues: returns to the queue before the broker dead-letters "
        "(without dead_letter_exchange: discards) a message",
    )

    @model_validator(mode="after")
    def _broker_accepts(self) -> Self:
        # RabbitMQ refuses both; failing here beats a channel error at startup.
        if self.type == "quorum" and not self.durable:
            refuse("durable", "quorum queues must be durable")
        if self.delivery_limit is not None and self.type != "quorum":
            refuse("delivery_limit", "only valid with type: quorum")
        return self


_STATUS_OR_CLASS: Final = {
    "anyOf": [
        {
            "type": "integer",
            "minimum": 100,
            "maximum": 599,
            "not": {"minimum": 200, "maximum": 299},
        },
        {"type": "string", "pattern": "^(1[0-9]{2}|[3-5][0-9]{2}|[45][xX][xX])$"},
    ]
}


RequestsPerSecond = Annotated[float, Strict(), AllowInfNan(False), Field(gt=0.0, le=1_000_000.0)]


class DeliverySettings(Section):
    """Attempts, timeouts and retry waits of one delivery."""

    retry: Annotated[int, Strict(), Field(ge=0)] = Field(
        default=5, description="Retries after the first attempt"
    )
    backoff_policy: BackoffPolicy = Field(
        default="exponential", description="exponential (d, 2d, 4d...) or linear (d, 2d, 3d...)"
    )
    # 0 would requeue a refused message straight back, in a hot loop.
    backoff_delay: Annotated[float, _POSITIVE_DURATION] = Field(
        default=0.2, description="The first retry's wait, d"
    )
    backoff_max: Annotated[float, _DURATION] = Field(
        default=30.0, description="No wait is longer (a Retry-After included)"
    )
    timeout: Annotated[float, _POSITIVE_DURATION] = Field(default=10.0, description="Per attempt")
    retry_on: Annotated[
        tuple[int | str, ...],
        Accepts(values.retry_on, {"type": "array", "items": _STATUS_OR_CLASS}, built=tuple),
    ] = Field(
        default=DEFAULT_RETRY_ON, description="Statuses (404) and classes (5xx) that are retried"
    )
    rate_limit: RequestsPerSecond | None = Field(
        default=None, description="Requests per second to the subscriber, retries included"
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.backoff_max < self.backoff_delay:
            refuse("backoff_max", "must be >= backoff_delay")
        return self


class CircuitBreakerSettings(Section):
    """When the subscriber is failing, stop taking messages and probe it until it
    answers again, instead of dead-lettering everything."""

    # ``dispatcher.delivery.breaker`` is the state machine these configure.

    failure_ratio: Annotated[float, Strict(), AllowInfNan(False), Field(gt=0.0, le=1.0)] = Field(
        default=0.5, description="Opens when this share of attempts in the window failed"
    )
    min_attempts: Annotated[int, Strict(), Field(ge=1)] = Field(
        default=20, description="and at least this many attempts were made in it"
    )
    window: Annotated[float, _POSITIVE_DURATION] = Field(
        default=30.0, description="The span of attempts counted"
    )
    open_for: Annotated[float, _POSITIVE_DURATION] = Field(
        default=30.0, description="First pause before a probe; doubles while probes fail"
    )
    max_open: Annotated[float, _POSITIVE_DURATION] = Field(
        default=300.0, description="Longest pause"
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.max_open < self.open_for:
            refuse("max_open", "must be >= open_for")
        return self


class DeadLetterSettings(Section):
    """Where an event that cannot be delivered goes (unset: rejected, to the
    queue's own dead-letter exchange if it has one)."""

    sink: Annotated[str | None, _HTTP_URL] = Field(
        default=None, description="An http(s) URL that receives what cannot be delivered"
    )
    exchange: StrictStr | None = Field(
        default=None, description='Or an exchange it is published to ("": the default exchange)'
    )
    routing_key: StrictStr = Field(default="", description="The routing key of that publish")


class ReplySettings(Section):
    """Where a subscriber's reply event (a CloudEvent in a 2xx answer) goes;
    unset: dropped."""

    # ``exchange: ""`` is the AMQP default exchange (routing key = queue name),
    # which is a real target, so only ``None`` means "no exchange".
    exchange: StrictStr | None = Field(
        default=None,
        description='The reply is published to this exchange ("": the default one)',
    )
    routing_key: StrictStr = Field(default="", description="The routing key of that publish")
    url: Annotated[str | None, _HTTP_URL] = Field(
        default=None, description="Or POSTed to this http(s) URL"
    )

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if self.exchange is not None and self.url is not None:
            refuse("", "set either exchange or url, not both")
        return self


class AuthSettings(Section):
    """How requests authenticate to the subscriber, beyond a URL's user:password@."""

    # Its token is read with the rest of what the settings name (``dispatcher.resolve``).
    bearer_token_file: Annotated[str | None, FILE] = Field(
        default=None,
        description="A file whose token every request of the binding sends as "
        "Authorization: Bearer, read again when the file changes",
    )


class AttributesFilter(Section):
    """Knative's Trigger filter: an event passes when every listed attribute equals
    its value. None listed: no filter."""

    attributes: Annotated[
        tuple[tuple[str, str], ...],
        Accepts(values.filter_attributes, attributes_schema(non_empty=False), "mapping", tuple),
    ] = Field(
        default=(), description='Attribute name to value; "" means present, whatever its value'
    )


_HEADERS_SCHEMA: Final = {
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
}
# The one schema of a filter entry, which nests (``schema`` puts it there).
FILTER_REF: Final = "#/$defs/filter"


class BindingSettings(Section):
    """One queue delivered to one subscriber."""

    name: Annotated[
        str,
        Accepts(
            values.binding_name, {"type": "string", "pattern": f"^{values.BINDING_NAME.pattern}$"}
        ),
    ] = Field(description="Names the binding in metrics and logs: 1-64 of A-Z a-z 0-9 _ . -")
    # At most 255 bytes: the AMQP 0-9-1 shortstr limit.
    queue: Annotated[str, _QUEUE] = Field(
        description="The queue to consume: classic or quorum (a stream is refused)"
    )
    declare: DeclareSettings | None = None
    subscriber: Annotated[str, _HTTP_URL] = Field(
        description="Where each event is POSTed: an http(s) URL"
    )
    content_mode: ContentMode = Field(
        default="binary",
        description="CloudEvents HTTP mode: binary (ce- headers) or structured (JSON body)",
    )
    tls: TlsSettings = Field(default_factory=TlsSettings)
    parallelism: AmqpShort = Field(default=10, description="Deliveries in flight at once")
    prefetch: AmqpShort | None = Field(
        default=None,
        description="Messages held unacked (running and waiting for a slot); unset: "
        "parallelism. For a queue with x-single-active-consumer, at least twice "
        "parallelism: the broker feeds only a channel's first consumer, which after a "
        "reconnect gets only the slots that deliveries still running leave free",
    )
    # With more than one message in flight a retry would overtake its successors.
    ordered: StrictBool = Field(
        default=False, description="One message at a time, whatever parallelism says"
    )
    delivery: DeliverySettings = Field(default_factory=DeliverySettings)
    circuit_breaker: CircuitBreakerSettings | None = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    headers: Annotated[
        tuple[tuple[str, str], ...], Accepts(values.headers, _HEADERS_SCHEMA, "headers", tuple)
    ] = Field(
        default=(),
        description="Extra request headers on every request of the binding "
        "(subscriber, dead-letter sink, reply URL)",
    )
    filter: AttributesFilter | None = None
    # When both are set, ``filters`` wins, as in Knative.
    filters: Annotated[
        tuple[FilterEntry, ...],
        Accepts(values.filters, {"type": "array", "items": {"$ref": FILTER_REF}}, "filters", tuple),
    ] = Field(default=(), description="Events that do not pass every filter are acked unsent")
    dedupe_window: Annotated[float, _DURATION] = Field(
        default=600.0, description="A redelivered event seen this recently is not sent again"
    )
    dead_letter: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    reply: ReplySettings = Field(default_factory=ReplySettings)
    non_cloudevent: NonCloudEvent = Field(
        default="wrap",
        description="A message that is not a CloudEvent: wrap it in one, or dead_letter it",
    )
    max_body_size: Annotated[int, size()] = Field(
        default=8 * 1024 * 1024, description="Bodies above this are dead-lettered, not buffered"
    )

    @property
    def effective_parallelism(self) -> int:
        """Deliveries in flight at once (requests to the subscriber and what follows
        them until their action): ``parallelism``, or 1 when ``ordered``."""
        return 1 if self.ordered else self.parallelism

    @property
    def effective_prefetch(self) -> int:
        """Messages this binding holds unacked: the ``effective_parallelism`` running and those
        waiting for a slot. The consumers' prefetch, so the broker never sends more
        and memory stays bounded."""
        return 1 if self.ordered else (self.prefetch or self.parallelism)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self._check_prefetch()
        self._check_authorization()
        return self

    def _check_prefetch(self) -> None:
        if self.prefetch is None:
            return
        if self.ordered and self.prefetch != 1:
            # A message waiting behind one being retried would be delivered before it
            # if that one went back to the queue.
            refuse("prefetch", "must be 1 or unset when ordered is true")
        if not self.ordered and self.prefetch < self.parallelism:
            refuse("prefetch", f"must be >= parallelism ({self.parallelism}), or unset")

    def _check_authorization(self) -> None:
        """One source of ``Authorization`` per binding: a URL's ``user:password@`` (Basic),
        ``auth`` (Bearer) or ``headers``; two would replace each other without a word."""
        addresses = {
            "subscriber": self.subscriber,
            "dead_letter.sink": self.dead_letter.sink,
            "reply.url": self.reply.url,
        }
        with_userinfo = [
            key
            for key, address in addresses.items()
            if address and urlsplit(address).username is not None
        ]
        basic = with_userinfo and (
            f"conflicts with the user:password@ of {with_userinfo[0]} (sent as Basic auth)"
        )
        if self.auth.bearer_token_file is not None and basic:
            refuse("auth.bearer_token_file", basic)
        if any(name.lower() == "authorization" for name, _ in self.headers):
            if self.auth.bearer_token_file is not None:
                refuse("headers.Authorization", "conflicts with auth.bearer_token_file")
            if basic:
                refuse("headers.Authorization", basic)


def _binding_list(raw: object) -> object:
    if not isinstance(raw, list | tuple):
        refuse("", f"must be a list, got {show(raw)}")
    if not raw:
        refuse("", "must list at least one binding")
    return raw


class Settings(Section):
    """The service's whole configuration."""

    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    shutdown: ShutdownSettings = Field(default_factory=ShutdownSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    dedupe: DedupeSettings = Field(default_factory=DedupeSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    # A service with no binding has nothing to do.
    bindings: Annotated[tuple[BindingSettings, ...], BeforeValidator(_binding_list)]

    @model_validator(mode="after")
    def _unique_names(self) -> Self:
        seen: set[str] = set()
        for index, binding in enumerate(self.bindings):
            if binding.name in seen:
                refuse(f"bindings[{index}].name", f"duplicate binding name {binding.name!r}")
            seen.add(binding.name)
        return self


class BatchSettings(Section):
    """What ``archive``, ``report`` and ``replay`` read of the service's configuration."""

    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
