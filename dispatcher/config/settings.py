"""The settings tree: what a loaded configuration is, as frozen dataclasses.

``Settings`` is the service's whole configuration; ``BatchSettings`` is the part
the batch commands read. Field names are the configuration's key names, and a
field's default is the value a missing key (or ``null``) means. A key that takes one
of a closed set of words has a ``Literal`` type listing them (``ContentMode``,
``BackoffPolicy``...), which the rule for the key reads its choices from.
Nothing here reads, checks or builds anything: ``rules`` says what each key accepts,
``sources`` fills the tree, and the code that connects (``dispatcher.broker``,
``dispatcher.http``) turns it into sockets and TLS contexts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from dispatcher.retry import DEFAULT_RETRY_ON

# The closed sets: the words a key accepts, in the order messages list them.
ContentMode = Literal["binary", "structured"]
BackoffPolicy = Literal["exponential", "linear"]
NonCloudEvent = Literal["wrap", "dead_letter"]
QueueType = Literal["classic", "quorum"]
LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["json", "console"]

# Field metadata telling ``render.effective_config`` how to write a value back in
# the form a user would write in the file.
# The longest this process keeps a message unacked on purpose (a hold in an
# open circuit breaker, a wait for a rate-limit slot): half the broker's default
# consumer_timeout (30 min), past which the broker closes the channel and
# requeues everything on it.
UNACKED_MAX: Final = 15 * 60.0

_DURATION: Final = {"render": "duration"}
_URL: Final = {"render": "url"}
_NUMBER: Final = {"render": "number"}
_SIZE: Final = {"render": "size"}


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """PEM files: the CAs to trust (else the system's) and a client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class ReconnectSettings:
    initial_delay: float = field(default=0.2, metadata=_DURATION)
    max_delay: float = field(default=30.0, metadata=_DURATION)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    # One URL, or the nodes of one cluster (a list in the file, comma-separated
    # in RABBITMQ_URL): see ``urls``.
    url: str | tuple[str, ...] = field(
        default="amqp://guest:guest@localhost:5672/%2F", metadata=_URL
    )
    heartbeat: float = field(default=20.0, metadata=_DURATION)
    connection_name: str = "dispatcher"
    tls: TlsSettings = field(default_factory=TlsSettings)
    reconnect: ReconnectSettings = field(default_factory=ReconnectSettings)
    blocked_timeout: float = field(default=60.0, metadata=_DURATION)

    @property
    def urls(self) -> tuple[str, ...]:
        """Every node's URL, in the order given."""
        return (self.url,) if isinstance(self.url, str) else self.url


@dataclass(frozen=True, slots=True)
class DedupeSettings:
    # redis:// or rediss://: claims shared by every replica (``dedupe_store``);
    # None keeps duplicate suppression in this process's memory.
    store: str | None = field(default=None, metadata=_URL)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    listen: str = "0.0.0.0:9090"

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]


def split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); empty host = all IPv4 interfaces; IPv6 in brackets.

    Raises ``ValueError`` saying what is wrong (``values.listen`` makes it a
    ``ConfigError`` naming the key).
    """
    if listen.startswith("["):
        host, bracket, rest = listen[1:].partition("]")
        if not bracket or not host or not rest.startswith(":"):
            raise ValueError("must be host:port, IPv6 hosts in brackets ([::1]:9090)")
        port_text = rest[1:]
    else:
        host, colon, port_text = listen.rpartition(":")
        if not colon:
            raise ValueError("must be host:port (e.g. 0.0.0.0:9090)")
        if ":" in host:
            raise ValueError("IPv6 hosts must be in brackets ([::]:9090)")
        host = host or "0.0.0.0"
    # Port 0 asks the OS for a free port (tests, several instances on one host).
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError("port must be 0..65535")
    return host, int(port_text)


@dataclass(frozen=True, slots=True)
class ShutdownSettings:
    grace: float = field(default=25.0, metadata=_DURATION)


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    level: LogLevel = "info"
    format: LogFormat = "json"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """OpenTelemetry spans over OTLP/HTTP; the standard ``OTEL_*`` variables
    override these (``sources``), and the exporter reads the rest of them
    itself (headers, resource attributes, a signal-specific endpoint)."""

    enabled: bool = False
    # The collector's base URL: ``/v1/traces`` is appended, as for
    # OTEL_EXPORTER_OTLP_ENDPOINT.
    endpoint: str = field(default="http://127.0.0.1:4318", metadata=_URL)
    # Parent-based: a sampled parent is always followed, one that is not never.
    sample_ratio: float = field(default=1.0, metadata=_NUMBER)
    service_name: str = "dispatcher"

    @property
    def traces_url(self) -> str:
        return self.endpoint.rstrip("/") + "/v1/traces"


@dataclass(frozen=True, slots=True)
class DeclareSettings:
    durable: bool = True
    type: QueueType = "classic"
    dead_letter_exchange: str | None = None
    delivery_limit: int | None = None


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    retry: int = 5
    backoff_policy: BackoffPolicy = "exponential"
    backoff_delay: float = field(default=0.2, metadata=_DURATION)
    backoff_max: float = field(default=30.0, metadata=_DURATION)
    timeout: float = field(default=10.0, metadata=_DURATION)
    # Statuses (404) and classes ("4xx", "5xx") that are retried; see retry.py.
    retry_on: tuple[int | str, ...] = DEFAULT_RETRY_ON
    # Requests per second to the subscriber, retries included (None: no limit).
    rate_limit: float | None = field(default=None, metadata=_NUMBER)


@dataclass(frozen=True, slots=True)
class CircuitBreakerSettings:
    """When the subscriber is failing, stop taking messages (``dispatcher.breaker``)."""

    failure_ratio: float = field(default=0.5, metadata=_NUMBER)
    min_attempts: int = 20
    window: float = field(default=30.0, metadata=_DURATION)
    open_for: float = field(default=30.0, metadata=_DURATION)
    max_open: float = field(default=300.0, metadata=_DURATION)


@dataclass(frozen=True, slots=True)
class DeadLetterSettings:
    sink: str | None = field(default=None, metadata=_URL)
    exchange: str | None = None
    routing_key: str = ""


@dataclass(frozen=True, slots=True)
class ReplySettings:
    # ``exchange: ""`` is the AMQP default exchange (routing key = queue name),
    # which is a real target, so only ``None`` means "no exchange".
    exchange: str | None = None
    routing_key: str = ""
    url: str | None = field(default=None, metadata=_URL)


@dataclass(frozen=True, slots=True)
class AuthSettings:
    # ``Authorization: Bearer <token>`` on every request of the binding, the
    # token kept current from this file (``dispatcher.bearer``).
    bearer_token_file: str | None = None


@dataclass(frozen=True, slots=True)
class AttributesFilter:
    """``filter``: Knative's Trigger filter. Every listed attribute equals its value;
    ``""`` means the attribute is present, whatever its value. None listed: no filter."""

    attributes: tuple[tuple[str, str], ...] = field(default=(), metadata={"render": "mapping"})


MatchDialect = Literal["exact", "prefix", "suffix"]
NestingDialect = Literal["all", "any", "not"]


@dataclass(frozen=True, slots=True)
class MatchFilter:
    """One ``filters`` entry comparing attributes: every one listed must match."""

    dialect: MatchDialect
    attributes: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class NestingFilter:
    """One ``filters`` entry combining others (``not`` holds exactly one)."""

    dialect: NestingDialect
    filters: tuple[FilterEntry, ...]


@dataclass(frozen=True, slots=True)
class CesqlFilter:
    """One ``filters`` entry holding a CloudEvents SQL expression (checked to compile)."""

    expression: str
    dialect: Literal["cesql"] = "cesql"


FilterEntry = MatchFilter | NestingFilter | CesqlFilter


@dataclass(frozen=True, slots=True)
class BindingSettings:
    name: str
    queue: str
    subscriber: str = field(metadata=_URL)
    declare: DeclareSettings | None = None
    content_mode: ContentMode = "binary"
    tls: TlsSettings = field(default_factory=TlsSettings)
    parallelism: int = 10
    # Messages held unacked (running and waiting for a slot); None: parallelism.
    prefetch: int | None = None
    # ``ordered: true`` forces prefetch 1 whatever ``parallelism`` says: with
    # more than one message in flight a retry would overtake its successors.
    ordered: bool = False
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
    circuit_breaker: CircuitBreakerSettings | None = None
    auth: AuthSettings = field(default_factory=AuthSettings)
    # Extra request headers, (name, value) in the file's order: every request of
    # the binding (subscriber, dead-letter sink, reply URL) carries them.
    headers: tuple[tuple[str, str], ...] = field(default=(), metadata={"render": "headers"})
    # Events that do not pass are acked unsent (``dispatcher.filters``); when
    # both are set, ``filters`` wins, as in Knative.
    filter: AttributesFilter | None = None
    filters: tuple[FilterEntry, ...] = field(default=(), metadata={"render": "filters"})
    dedupe_window: float = field(default=600.0, metadata=_DURATION)
    dead_letter: DeadLetterSettings = field(default_factory=DeadLetterSettings)
    reply: ReplySettings = field(default_factory=ReplySettings)
    non_cloudevent: NonCloudEvent = "wrap"
    # Bodies above this are dead-lettered, not buffered.
    max_body_size: int = field(default=8 * 1024 * 1024, metadata=_SIZE)

    @property
    def workers(self) -> int:
        """Deliveries in flight at once (requests to the subscriber and what follows
        them until the verdict)."""
        return 1 if self.ordered else self.parallelism

    @property
    def held(self) -> int:
        """Messages this binding holds unacked: the ``workers`` running and those
        waiting for a slot. The consumers' prefetch, so the broker never sends more
        and memory stays bounded."""
        return 1 if self.ordered else (self.prefetch or self.parallelism)


@dataclass(frozen=True, slots=True)
class Settings:
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    shutdown: ShutdownSettings = field(default_factory=ShutdownSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    dedupe: DedupeSettings = field(default_factory=DedupeSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    bindings: tuple[BindingSettings, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """What ``archive``, ``report`` and ``replay`` read of the service's configuration."""

    broker: BrokerSettings = field(default_factory=BrokerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
