"""YAML + environment -> one frozen ``Settings`` tree, validated up front.

The key names are the contract in PRODUCT.md ("Configuration"). Every error is
a ``ConfigError`` naming the full key path (``bindings[0].delivery.retry``) or,
for a value that came from the environment, the variable (``LOG_FORMAT``).

Loading is two steps so other sources can feed the same validation: something
builds a raw ``dict`` (today only the YAML file; Knative drop-in mode will
build one from its environment variables), then ``settings_from_dict``
applies the environment overrides and validates.

Passwords never leave this module: every URL quoted in an error message or in
``effective_config`` goes through ``redact_url``.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import re
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, get_args
from urllib.parse import urlsplit

import pika
import yaml

from dispatcher.bearer import read_token
from dispatcher.errors import ConfigError, TokenFileError
from dispatcher.retry import DEFAULT_RETRY_ON, RETRY_CLASSES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

DEFAULT_CONFIG_PATH: Final = "config/dispatcher.yaml"

# Field metadata telling ``effective_config`` how to render a value back into
# the form a user would write in the file.
_DURATION: Final = {"render": "duration"}
_URL: Final = {"render": "url"}
_SIZE: Final = {"render": "size"}


# --------------------------------------------------------------------------
# The settings tree
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TlsSettings:
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
        return _split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return _split_listen(self.listen)[1]


@dataclass(frozen=True, slots=True)
class ShutdownSettings:
    grace: float = field(default=25.0, metadata=_DURATION)


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    level: str = "info"
    format: str = "json"


@dataclass(frozen=True, slots=True)
class DeclareSettings:
    durable: bool = True
    type: str = "classic"
    dead_letter_exchange: str | None = None
    delivery_limit: int | None = None


@dataclass(frozen=True, slots=True)
class DeliverySettings:
    retry: int = 5
    backoff_policy: str = "exponential"
    backoff_delay: float = field(default=0.2, metadata=_DURATION)
    backoff_max: float = field(default=30.0, metadata=_DURATION)
    timeout: float = field(default=10.0, metadata=_DURATION)
    # Statuses (404) and classes ("4xx", "5xx") that are retried; see retry.py.
    retry_on: tuple[int | str, ...] = DEFAULT_RETRY_ON


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
    ``""`` means the attribute is present (and not empty). None listed: no filter."""

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


FilterEntry = MatchFilter | NestingFilter


@dataclass(frozen=True, slots=True)
class BindingSettings:
    name: str
    queue: str
    subscriber: str = field(metadata=_URL)
    declare: DeclareSettings | None = None
    content_mode: str = "binary"
    tls: TlsSettings = field(default_factory=TlsSettings)
    parallelism: int = 10
    # ``ordered: true`` forces prefetch 1 whatever ``parallelism`` says: with
    # more than one message in flight a retry would overtake its successors.
    ordered: bool = False
    delivery: DeliverySettings = field(default_factory=DeliverySettings)
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
    non_cloudevent: str = "wrap"
    # Not in PRODUCT.md: bodies above this are dead-lettered, not buffered.
    max_body_size: int = field(default=8 * 1024 * 1024, metadata=_SIZE)

    @property
    def workers(self) -> int:
        """Deliveries in flight at once: the prefetch and the worker-pool size, which
        must be equal (memory is bounded because the broker never sends more)."""
        return 1 if self.ordered else self.parallelism


@dataclass(frozen=True, slots=True)
class Settings:
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    http: HttpSettings = field(default_factory=HttpSettings)
    shutdown: ShutdownSettings = field(default_factory=ShutdownSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    dedupe: DedupeSettings = field(default_factory=DedupeSettings)
    bindings: tuple[BindingSettings, ...] = ()


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """What ``archive``, ``report`` and ``replay`` read of the service's configuration."""

    broker: BrokerSettings = field(default_factory=BrokerSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------

# (variable, section, key): applied after the file, before validation, so a
# Kubernetes Secret can supply the broker URL without touching the file.
_ENV_OVERRIDES: Final = (
    ("RABBITMQ_URL", "broker", "url"),
    ("DEDUPE_STORE_URL", "dedupe", "store"),
    ("DISPATCHER_LISTEN", "http", "listen"),
    ("LOG_LEVEL", "logging", "level"),
    ("LOG_FORMAT", "logging", "format"),
)


def load_settings(path: str | None, environ: Mapping[str, str]) -> Settings:
    """Read the config file (``path``, else ``$DISPATCHER_CONFIG``, else the default).

    With no config file at all and ``QUEUE_NAME`` set, build one binding from
    the Knative dispatcher's variables instead (``dispatcher.knative``).
    """
    resolved, named_by = _resolve_config_path(path, environ)
    if named_by == "config" and not path:
        from dispatcher import knative  # knative imports this module

        if knative.wanted(environ, os.path.exists(resolved)):
            # raw_config has applied RABBITMQ_URL already (with RABBITMQ_VHOST):
            # applying it again would drop that vhost.
            rest = {k: v for k, v in environ.items() if k != "RABBITMQ_URL"}
            return settings_from_dict(knative.raw_config(environ), rest, knative.ORIGINS)
    raw = _read_yaml(resolved, named_by)
    return settings_from_dict(raw, environ)


def load_batch_settings(
    path: str | None, environ: Mapping[str, str], sections: tuple[str, ...] = ("broker", "logging")
) -> BatchSettings:
    """The ``broker`` and ``logging`` sections alone, for the batch commands: only
    those of ``sections`` are read and checked (``report`` never connects to a
    broker, so a broker setting it cannot use must not stop it); the others keep
    their defaults.

    They read the same file as the service when there is one (bindings are not
    needed, so not required), else the defaults; the environment overrides
    either (``RABBITMQ_URL``, ``LOG_LEVEL``, ``LOG_FORMAT``), as for the service.
    """
    resolved, named_by = _resolve_config_path(path, environ)
    raw: Mapping[str, object] = {}
    if path or named_by != "config" or os.path.exists(resolved):
        raw = _read_yaml(resolved, named_by)
    merged, origins = _apply_env_overrides({name: raw.get(name) for name in sections}, environ)
    wanted = {name: merged[name] for name in sections if name in merged}
    with _blaming_variables(origins):
        return _build(BatchSettings, wanted, "")


def settings_from_dict(
    raw: Mapping[str, object],
    environ: Mapping[str, str],
    origins_of_raw: Mapping[str, str] | None = None,
) -> Settings:
    """Apply the environment overrides to ``raw`` and validate the result.

    ``origins_of_raw`` maps key paths to the variables they came from, when
    ``raw`` itself was built from the environment, so errors name those.
    """
    merged, origins = _apply_env_overrides(raw, environ)
    with _blaming_variables({**(origins_of_raw or {}), **origins}):
        return _settings(merged, "")


@contextmanager
def _blaming_variables(origins: Mapping[str, str]) -> Iterator[None]:
    """A ConfigError about a key that came from a variable names the variable:
    the user has to fix that, not the file."""
    try:
        yield
    except ConfigError as err:
        # broker.url[1] came from RABBITMQ_URL too (its second node).
        variable = origins.get(err.key) or origins.get(re.sub(r"\[[0-9]+\]$", "", err.key))
        if variable is None:
            raise
        raise ConfigError(variable, err.problem) from None


def _resolve_config_path(path: str | None, environ: Mapping[str, str]) -> tuple[str, str]:
    """Return the path and what chose it, so "file not found" can blame the right thing."""
    if path:
        return path, "config"
    from_env = environ.get("DISPATCHER_CONFIG")
    if from_env:
        return from_env, "DISPATCHER_CONFIG"
    return DEFAULT_CONFIG_PATH, "config"


def _read_yaml(path: str, named_by: str) -> Mapping[str, object]:
    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        raise ConfigError(named_by, f"file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(named_by, f"is a directory, not a file: {path}") from None
    except OSError as err:
        raise ConfigError(named_by, f"cannot read {path}: {err.strerror}") from None
    try:
        # Bytes, not text: lets PyYAML honour a UTF-16 BOM as the YAML spec says.
        document = yaml.load(data, Loader=_StrictLoader)
    except yaml.YAMLError as err:
        raise ConfigError("config", f"invalid YAML in {path}{_yaml_where(err)}") from None
    except (ValueError, KeyError, RecursionError) as err:
        # PyYAML's constructors raise these, not a YAMLError, for a value its
        # explicit tag cannot read (`!!bool maybe`, `!!int x`, `!!timestamp
        # 2026-13-01`) and for collections nested deeper than Python's stack.
        what = "nested too deep" if isinstance(err, RecursionError) else "a tagged value"
        raise ConfigError(
            "config", f"invalid YAML in {path}: {what} cannot be read ({_show_error(err)})"
        ) from None
    if document is None:
        raise ConfigError("config", f"{path} is empty")
    if not isinstance(document, Mapping):
        raise ConfigError("config", f"{path}: top level must be a mapping, got {_show(document)}")
    return document


def _show_error(err: BaseException) -> str:
    return _redact_text(f"{type(err).__name__}: {err}")[:200]


def _yaml_where(err: yaml.YAMLError) -> str:
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        problem = err.problem or "syntax error"
        where = f" at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    else:
        where = f": {err}"
    return _redact_text(where)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML silently collapses."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            # Merge keys (``<<: *defaults``) may legitimately be overridden.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _apply_env_overrides(
    raw: Mapping[str, object], environ: Mapping[str, str]
) -> tuple[dict[str, object], dict[str, str]]:
    """Return the merged raw config and which key paths came from which variable."""
    merged = dict(raw)
    origins: dict[str, str] = {}
    for variable, section, key in _ENV_OVERRIDES:
        value = environ.get(variable)
        # Empty counts as unset: manifests often render an optional variable as "".
        if not value:
            continue
        current = merged.get(section)
        if current is None:
            current = {}
        if not isinstance(current, Mapping):
            continue  # validation reports the file's malformed section as it is
        merged[section] = {**current, key: value}
        origins[f"{section}.{key}"] = variable
    return merged, origins


# --------------------------------------------------------------------------
# Validation: one builder per section
# --------------------------------------------------------------------------


def _settings(raw: object, key: str) -> Settings:
    return _build(Settings, raw, key)


def _build(shape: type[T], raw: object, key: str) -> T:
    """A section: each field read by its rule in ``_RULES``, then the checks that
    span fields (``_CHECKS``). Fields are read in declaration order, so the first
    bad key in the file's own order is the one reported."""
    assert is_dataclass(shape)
    s = _Section(raw, key, shape)
    rules = _RULES[shape]
    values = {f.name: rules[f.name].read(s, f) for f in fields(shape)}
    built = shape(**values)
    check = _CHECKS.get(shape)
    if check is not None:
        check(built, s)
    return built


def _check_broker(broker: Any, s: _Section) -> None:
    if len({pika.URLParameters(url).virtual_host for url in broker.urls}) > 1:
        raise ConfigError(s.sub("url"), "every node of one cluster must name the same virtual host")


def _check_reconnect(reconnect: Any, s: _Section) -> None:
    if reconnect.max_delay < reconnect.initial_delay:
        raise ConfigError(s.sub("max_delay"), "must be >= initial_delay")


def _check_tls(tls: Any, s: _Section) -> None:
    if tls.cert_file is not None and tls.key_file is None:
        raise ConfigError(s.sub("key_file"), "required when cert_file is set")
    if tls.key_file is not None and tls.cert_file is None:
        raise ConfigError(s.sub("cert_file"), "required when key_file is set")


def _check_declare(declare: Any, s: _Section) -> None:
    # RabbitMQ refuses both; failing here beats a channel error at startup.
    if declare.type == "quorum" and not declare.durable:
        raise ConfigError(s.sub("durable"), "quorum queues must be durable")
    if declare.delivery_limit is not None and declare.type != "quorum":
        raise ConfigError(s.sub("delivery_limit"), "only valid with type: quorum")


def _check_delivery(delivery: Any, s: _Section) -> None:
    if delivery.backoff_max < delivery.backoff_delay:
        raise ConfigError(s.sub("backoff_max"), "must be >= backoff_delay")


def _check_binding(binding: Any, s: _Section) -> None:
    """One source of ``Authorization`` per binding: a URL's ``user:password@`` (Basic),
    ``auth`` (Bearer) or ``headers``; two would replace each other without a word."""
    urls = {
        "subscriber": binding.subscriber,
        "dead_letter.sink": binding.dead_letter.sink,
        "reply.url": binding.reply.url,
    }
    with_userinfo = [key for key, url in urls.items() if url and urlsplit(url).username is not None]
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


def _check_reply(reply: Any, s: _Section) -> None:
    if reply.exchange is not None and reply.url is not None:
        raise ConfigError(s.key, "set either exchange or url, not both")


_LOG_LEVEL_ALIASES: Final = {"warn": "warning"}  # what LOG_LEVEL=warn means everywhere else


def _bindings(raw: object, key: str) -> tuple[BindingSettings, ...]:
    if raw is None:
        raise ConfigError(key, "required: list at least one binding")
    if not isinstance(raw, list):
        raise ConfigError(key, f"must be a list, got {_show(raw)}")
    if not raw:
        raise ConfigError(key, "must list at least one binding")
    bindings = tuple(_build(BindingSettings, item, f"{key}[{i}]") for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, binding in enumerate(bindings):
        if binding.name in seen:
            raise ConfigError(f"{key}[{i}].name", f"duplicate binding name {binding.name!r}")
        seen.add(binding.name)
    return bindings


class _Section:
    """A mapping at ``key`` whose keys must be the fields of ``shape``."""

    def __init__(self, raw: object, key: str, shape: type[DataclassInstance]) -> None:
        self.key = key
        self._raw = _mapping(raw, key)
        allowed = sorted(f.name for f in fields(shape))
        for name in self._raw:
            if name not in allowed:
                raise ConfigError(
                    self.sub(_written(name)), f"unknown key (expected one of: {', '.join(allowed)})"
                )

    def sub(self, name: str) -> str:
        return f"{self.key}.{name}" if self.key else name

    def raw(self, name: str) -> object:
        return self._raw.get(name)

    def get(self, name: str, parse: Callable[[object, str], T], default: T) -> T:
        # null means "use the default": Helm templates render unset values as null.
        value = self._raw.get(name)
        return default if value is None else parse(value, self.sub(name))

    def optional(self, name: str, parse: Callable[[object, str], T]) -> T | None:
        value = self._raw.get(name)
        return None if value is None else parse(value, self.sub(name))

    def require(self, name: str, parse: Callable[[object, str], T]) -> T:
        value = self._raw.get(name)
        if value is None:
            raise ConfigError(self.sub(name), "required")
        return parse(value, self.sub(name))

    def nested(self, name: str, build: Callable[[object, str], T]) -> T:
        return build(self._raw.get(name), self.sub(name))


_PLAIN_KEY: Final = re.compile(r"[^\s.\[\]'\"]+")


def _written(name: str) -> str:
    """An unknown key as the message names it: as written when plain, quoted when
    it is empty or could read as a path (``a.b``, ``x[0]``) or hide in spaces."""
    return name if _PLAIN_KEY.fullmatch(name) and name.isprintable() else repr(name)


def _mapping(raw: object, key: str) -> Mapping[str, object]:
    # The top level has no key of its own: its errors name the file ("config").
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(key or "config", f"must be a mapping, got {_show(raw)}")
    for name in raw:
        if not isinstance(name, str):
            raise ConfigError(key or "config", f"keys must be strings, got {_show(name)}")
    return raw


# --------------------------------------------------------------------------
# Scalar parsers: (value, key) -> typed value, or ConfigError naming key
# --------------------------------------------------------------------------


def _str(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {_show(value)}")
    return value


def _non_empty_str(value: object, key: str) -> str:
    text = _str(value, key)
    if not text:
        raise ConfigError(key, "must not be empty")
    return text


def _bool(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be a boolean (true or false), got {_show(value)}")
    return value


def _int(value: object, key: str) -> int:
    # bool is an int subclass in Python, but `parallelism: true` is a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {_show(value)}")
    return value


def _retry_on(value: object, key: str) -> tuple[int | str, ...]:
    """``delivery.retry_on``: statuses 100-599 (not 2xx, which is success) and the
    classes ``4xx``/``5xx``; a status may be written as a number or a string."""
    if not isinstance(value, list):
        raise ConfigError(
            key, f"must be a list of statuses and classes (e.g. [409, 5xx]), got {_show(value)}"
        )
    entries: list[int | str] = []
    for index, item in enumerate(value):
        entry = _retry_entry(item, f"{key}[{index}]")
        if entry not in entries:
            entries.append(entry)
    return tuple(entries)


def _retry_entry(item: object, key: str) -> int | str:
    if isinstance(item, str) and item.lower() in RETRY_CLASSES:
        return item.lower()
    if isinstance(item, str) and re.fullmatch(r"[0-9]{3}", item):
        item = int(item)
    if isinstance(item, bool) or not isinstance(item, int):
        raise ConfigError(
            key, f"must be a status (409) or one of {', '.join(RETRY_CLASSES)}, got {_show(item)}"
        )
    if not 100 <= item <= 599:
        raise ConfigError(key, f"must be an HTTP status between 100 and 599, got {item}")
    if 200 <= item <= 299:
        raise ConfigError(key, f"{item} is a success: it is never retried")
    return item


# RFC 9110 token characters; values: visible ASCII, spaces and tabs (no CR/LF).
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE: Final = re.compile(r"[\t -~]*")
# Written by the event mapping, by libcurl, or framing the request: never the user's.
_RESERVED_HEADERS: Final = frozenset(
    {"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "expect"}
)


def _headers(value: object, key: str) -> tuple[tuple[str, str], ...]:
    """``headers``: extra request headers, a mapping of name to value."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping of header names to values, got {_show(value)}")
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for name, raw in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ConfigError(key, f"{_show(name)} is not a header name (RFC 9110 token)")
        lower = name.lower()
        if lower.startswith(("ce-", "content-")) or lower in _RESERVED_HEADERS:
            raise ConfigError(
                f"{key}.{name}",
                "is written by dispatcher (the CloudEvent, its body or HTTP framing)",
            )
        if lower in seen:
            raise ConfigError(f"{key}.{name}", "is listed twice (header names ignore case)")
        seen.add(lower)
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise ConfigError(f"{key}.{name}", f"must be a string, got {_show(raw)}")
        text = str(raw)
        if not _HEADER_VALUE.fullmatch(text):
            raise ConfigError(
                f"{key}.{name}", "must be printable ASCII: no line breaks or control characters"
            )
        pairs.append((name, text))
    return tuple(pairs)


# Knative's rule for attribute names in Trigger filters.
_ATTRIBUTE_NAME: Final = re.compile(r"[a-z][a-z0-9]*")
_MATCH_DIALECTS: Final[tuple[str, ...]] = get_args(MatchDialect)
_NESTING_DIALECTS: Final[tuple[str, ...]] = get_args(NestingDialect)


def _filter_attributes(
    value: object, key: str, *, allow_empty: bool = True
) -> tuple[tuple[str, str], ...]:
    """A mapping of CloudEvents attribute names (extensions included) to strings."""
    if not isinstance(value, Mapping):
        raise ConfigError(
            key, f"must be a mapping of attribute names to values, got {_show(value)}"
        )
    pairs: list[tuple[str, str]] = []
    for name, text in value.items():
        if not isinstance(name, str) or not _ATTRIBUTE_NAME.fullmatch(name):
            raise ConfigError(
                key,
                f"{_show(name)} is not an attribute name "
                "(a lower-case letter, then lower-case letters and digits)",
            )
        if not isinstance(text, str):
            raise ConfigError(f"{key}.{name}", f"must be a string (quote it), got {_show(text)}")
        if not text and not allow_empty:
            raise ConfigError(
                f"{key}.{name}",
                "must not be empty (Knative skips such a filter; to require that an attribute "
                'exists, use filter.attributes with the value "")',
            )
        pairs.append((name, text))
    return tuple(pairs)


# all/any/not nested deeper than this is refused: no real filter needs it, and
# hundreds of levels would exhaust the stack of whatever walks the tree
# (``check``'s YAML output first).
MAX_FILTER_DEPTH: Final = 32


def _filters(value: object, key: str) -> tuple[FilterEntry, ...]:
    """``filters``: Knative's newer Trigger filters, a list that must all pass."""
    return _filter_list(value, key, 1)


def _filter_list(value: object, key: str, depth: int) -> tuple[FilterEntry, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of filters, got {_show(value)}")
    return tuple(_filter_entry(item, f"{key}[{index}]", depth) for index, item in enumerate(value))


def _filter_entry(value: object, key: str, depth: int) -> FilterEntry:
    if depth > MAX_FILTER_DEPTH:
        raise ConfigError(key, f"filters nest at most {MAX_FILTER_DEPTH} levels deep")
    entry = _mapping(value, key)
    if "cesql" in entry:
        raise ConfigError(
            f"{key}.cesql",
            "CESQL is not supported; use exact, prefix, suffix, all, any or not",
        )
    dialects = [*_MATCH_DIALECTS, *_NESTING_DIALECTS]
    unknown = [name for name in entry if name not in dialects]
    if unknown:
        raise ConfigError(
            f"{key}.{_written(unknown[0])}",
            f"unknown filter dialect (expected one of: {', '.join(dialects)})",
        )
    if len(entry) != 1:
        found = " and ".join(entry) if entry else "none"
        raise ConfigError(key, f"a filter has exactly one dialect, found {found}")
    [(dialect, body)] = entry.items()
    where = f"{key}.{dialect}"
    if dialect in _MATCH_DIALECTS:
        attributes = _filter_attributes(body, where, allow_empty=False)
        if not attributes:
            raise ConfigError(where, "must name at least one attribute")
        return MatchFilter(dialect, attributes)  # type: ignore[arg-type]
    if dialect == "not":
        return NestingFilter("not", (_filter_entry(body, where, depth + 1),))
    nested = _filter_list(body, where, depth + 1)
    if not nested:
        raise ConfigError(where, "must list at least one filter")
    return NestingFilter(dialect, nested)  # type: ignore[arg-type]


def _int_at_least(minimum: int) -> Callable[[object, str], int]:
    def parse(value: object, key: str) -> int:
        number = _int(value, key)
        if number < minimum:
            raise ConfigError(key, f"must be >= {minimum}")
        return number

    return parse


def _int_between(low: int, high: int) -> Callable[[object, str], int]:
    def parse(value: object, key: str) -> int:
        number = _int(value, key)
        if not low <= number <= high:
            raise ConfigError(key, f"must be between {low} and {high}")
        return number

    return parse


def _choice(
    *options: str, lower: bool = False, aliases: Mapping[str, str] | None = None
) -> Callable[[object, str], str]:
    def parse(value: object, key: str) -> str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be one of {', '.join(options)}, got {_show(value)}")
        text = value.lower() if lower else value
        text = aliases.get(text, text) if aliases else text
        if text not in options:
            raise ConfigError(key, f"must be one of {', '.join(options)}, got {_show(value)}")
        return text

    return parse


_BINDING_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _binding_name(value: object, key: str) -> str:
    name = _str(value, key)
    # Names become Prometheus label values and log fields: keep them plain.
    if not _BINDING_NAME.fullmatch(name):
        raise ConfigError(key, f"must be 1-64 characters of A-Z a-z 0-9 _ . - (got {_show(name)})")
    return name


def _queue_name(value: object, key: str) -> str:
    name = _non_empty_str(value, key)
    if len(name.encode("utf-8")) > 255:  # AMQP 0-9-1 shortstr limit
        raise ConfigError(key, "must be at most 255 bytes")
    return name


def _token_file(value: object, key: str) -> str:
    path = _existing_file(value, key)
    try:
        read_token(path)  # what the service will send: refused now, not per request
    except TokenFileError as e:
        raise ConfigError(key, f"no token in {path}: {e}") from e
    return path


def _existing_file(value: object, key: str) -> str:
    path = _non_empty_str(value, key)
    # Relative paths are relative to the working directory, as they will be
    # when the TLS context is built.
    if not os.path.isfile(path):
        raise ConfigError(key, f"file not found: {path}")
    return path


_SIZE_UNITS: Final = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "kib": 1024, "mib": 1024**2}
_SIZE_RE: Final = re.compile(r"([0-9]+)\s*([A-Za-z]*)")


def _size(value: object, key: str) -> int:
    if isinstance(value, str):
        match = _SIZE_RE.fullmatch(value.strip())
        if match is None or match.group(2).lower() not in _SIZE_UNITS:
            raise ConfigError(
                key, f"invalid size {_show(value)} (use bytes or a B, KB, MB, KiB or MiB suffix)"
            )
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    elif isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        raise ConfigError(key, f"must be a size such as 8MiB or 8388608, got {_show(value)}")
    if size <= 0:
        raise ConfigError(key, "must be > 0")
    return size


def _listen(value: object, key: str) -> str:
    listen = _str(value, key)
    try:
        _split_listen(listen)
    except ValueError as err:
        raise ConfigError(key, f"{err}, got {_show(listen)}") from None
    return listen


def _split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); empty host = all IPv4 interfaces; IPv6 in brackets."""
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


# --------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------

# A URL's scheme, "amqp://" or "rediss://": redaction works for any of them.
_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def redact_url(url: str) -> str:
    """``url`` with any userinfo password replaced by ``***`` (the user name is kept).

    People paste passwords without percent-encoding them, so a password may
    hold ``/``, ``?``, ``#``, ``@``, ``%``, spaces, even ``://``: RFC 3986's
    reading (the authority ends at the first ``/``) would show half of
    ``pa/ss``. So the password here is everything from the first ``:`` after
    ``scheme://`` to the *last* ``@`` of the whole string. A URL with no
    password but a ``:`` then an ``@`` later (``http://h:8080/a@b``) reads as
    one and gets masked: hiding too much is the safe mistake. Without a
    ``scheme://`` (``user:pw@host``, ``//user:pw@host``, a user's typo) the
    same rule applies from the start of the string, but for ``mailto:``.
    """
    scheme = _SCHEME.search(url)
    start = scheme.end() if scheme is not None else 0
    if scheme is None and url[:7].lower() == "mailto:":
        return url  # "mailto:a@b" holds an address, not user:password
    at = url.rfind("@", start)
    colon = url.find(":", start, at)
    if at < 0 or colon < 0:
        return url  # no "@", or a user name alone: nothing secret
    return f"{url[: colon + 1]}***{url[at:]}"


def _redact_text(text: str) -> str:
    """Free text (a YAML parser's message) with any ``scheme://user:pw@`` masked.

    From the first URL on, the text is read as one URL (``redact_url``): a
    password may hold spaces or ``://``, so no shorter cut is safe. Text
    without ``://`` is left alone: ``found character '@'`` is no secret.
    """
    return redact_url(text) if _SCHEME.search(text) else text


_NODE_SEPARATOR: Final = re.compile(r"\s*,\s*(?=amqps?://)", re.IGNORECASE)


def split_nodes(urls: str) -> list[str]:
    """Comma-separated broker URLs (``RABBITMQ_URL``) as a list. Only a comma before
    ``amqp://`` or ``amqps://`` separates nodes: a password may hold commas."""
    return [part.strip() for part in _NODE_SEPARATOR.split(urls)]


def _amqp_urls(value: object, key: str) -> str | tuple[str, ...]:
    """``broker.url``: one URL, or a cluster's nodes as a list or comma-separated.
    Only a comma before ``amqp://`` or ``amqps://`` separates nodes: a password
    may hold commas (and a split inside it would show its first half)."""
    if isinstance(value, str) and _NODE_SEPARATOR.search(value):
        value = split_nodes(value)
    if not isinstance(value, list):
        return _amqp_url(value, key)
    if not value:
        raise ConfigError(key, "must name at least one node")
    urls = tuple(_amqp_url(item, f"{key}[{index}]") for index, item in enumerate(value))
    return urls[0] if len(urls) == 1 else urls


def _amqp_url(value: object, key: str) -> str:
    url = _url(value, key, ("amqp", "amqps"), "an amqp(s) URL")
    try:
        # Query parameters (?heartbeat=, ?channel_max=) are pika's to read: let
        # it reject them now rather than at connect time, forever, in a loop.
        pika.URLParameters(url)
    except Exception as e:  # pika raises ValueError, TypeError or its own errors
        raise ConfigError(key, f"invalid connection parameter in {_show(url)}: {e}") from None
    return url


def _redis_url(value: object, key: str) -> str:
    url = _url(value, key, ("redis", "rediss"), "a redis(s) URL")
    database = urlsplit(url).path.strip("/")
    if database and not database.isdigit():
        raise ConfigError(key, f"the path must be a database number, got {_show(url)}")
    return url


def _heartbeat(value: object, key: str) -> float:
    seconds = parse_duration(value, key)
    if seconds < 1:
        # 0 would turn heartbeats off (as RabbitMQ allows): then a silently dropped
        # connection is never noticed, consumption stops for good and a publish
        # waits for its confirm forever (FIELD-NOTES failure 3). Not offered.
        raise ConfigError(key, "must be at least 1s (heartbeats detect silent connections)")
    if seconds > 65535:
        raise ConfigError(key, "must be at most 65535s (the AMQP limit)")
    return seconds


def _http_url(value: object, key: str) -> str:
    url = _url(value, key, ("http", "https"), "an http(s) URL")
    problem = http_url_problem(url)
    if problem is not None:
        raise ConfigError(key, f"must be an http(s) URL as RFC 3986 writes it: {problem}")
    return url


# RFC 3986: what may appear in the authority's userinfo, and in a path or query,
# besides percent-encodings (checked on their own).
_UNRESERVED_SUBDELIMS: Final = r"A-Za-z0-9\-._~!$&'()*+,;="
_USERINFO: Final = re.compile(rf"[{_UNRESERVED_SUBDELIMS}%:]*")
_PATH_QUERY: Final = re.compile(rf"[{_UNRESERVED_SUBDELIMS}%:@/?]*")
_BAD_PERCENT: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_HOST_LABEL: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_NUMERIC_LABEL: Final = re.compile(r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)")
_DECIMAL_OCTET: Final = re.compile(r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])")


def http_url_problem(url: str) -> str | None:
    """Why libcurl could read ``url`` differently from how this configuration (and
    every log line) shows it, or ``None`` when the two readings agree.

    Only what RFC 3986 allows unencoded is accepted: curl and Python's URL
    parser differ on spaces, backslashes, a second ``@``, fragments and
    numeric hosts that are not dotted quads (curl reads ``http://010.1/`` as
    8.0.0.1, ``http://2130706433/`` as 127.0.0.1), so each is refused here
    with a reason instead of being sent somewhere unexpected.
    """
    for wrong, problem in (
        (not url.isascii() or not url.isprintable(), _NOT_ASCII),
        (" " in url, "a space (write %20)"),
        ("#" in url, "a fragment ('#...') is never sent; remove it"),
        (_BAD_PERCENT.search(url) is not None, "a '%' not followed by two hex digits (write %25)"),
    ):
        if wrong:
            return problem
    rest = url.split("://", 1)[1]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    bad = next((c for c in tail if not _PATH_QUERY.fullmatch(c)), None)
    if bad is not None:
        return f"{bad!r} in the path or query (percent-encode it)"
    userinfo, at, hostport = authority.rpartition("@")
    if at and not _USERINFO.fullmatch(userinfo):
        return "user:password@ with a character that must be percent-encoded ('@', '/', ...)"
    return _host_problem(hostport)


_NOT_ASCII: Final = "only printable ASCII (percent-encode the rest, punycode for host names)"


def _host_problem(hostport: str) -> str | None:
    if hostport.startswith("["):
        literal, _, port = hostport[1:].partition("]")
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return f"[{literal}] is not an IPv6 address"
        return None if not port or re.fullmatch(r":[0-9]+", port) else _BAD_PORT
    host, colon, port = hostport.partition(":")
    if colon and not port.isdigit():
        return _BAD_PORT
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return f"host {host!r} must be a DNS name (letters, digits, '-', '_') or an IP address"
    numeric = all(_NUMERIC_LABEL.fullmatch(label) for label in labels)
    if numeric and not (len(labels) == 4 and all(_DECIMAL_OCTET.fullmatch(x) for x in labels)):
        return f"numeric host {host!r} must be a dotted IPv4 address (a.b.c.d, no leading zeros)"
    return None


_BAD_PORT: Final = "a port must be digits after the ':'"


def _url(value: object, key: str, schemes: tuple[str, ...], what: str) -> str:
    url = _str(value, key)
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0  # .port raises on junk
    except ValueError:
        raise ConfigError(key, f"must be {what}, got {_show(url)}") from None
    if parts.scheme.lower() not in schemes:
        raise ConfigError(key, f"must be {what}, got {_show(url)}")
    if not parts.hostname:
        raise ConfigError(key, f"must be {what} with a host, got {_show(url)}")
    if not port_ok:
        raise ConfigError(key, f"must be {what} with a port in 1..65535, got {_show(url)}")
    if _at_after_authority(url):
        # amqp://user:12/ss@host/ connects to host "user", port 12, while every
        # redacted rendering shows amqp://user:***@host/: refuse the ambiguity.
        raise ConfigError(
            key,
            f"must be {what} without an '@' after the host (percent-encode '/', '?', '#' "
            f"and '@' in a password as %2F, %3F, %23, %40), got {_show(url)}",
        )
    return url


def _at_after_authority(url: str) -> bool:
    """True when ``redact_url`` would mask past the RFC 3986 authority: a ``:``
    then an ``@`` in the path, query or fragment, read here as a password."""
    scheme = _SCHEME.search(url)
    start = scheme.end() if scheme is not None else 0
    authority_end = min((i for i in map(url.find, "/?#", [start] * 3) if i >= 0), default=len(url))
    return url.rfind("@") > authority_end and redact_url(url) != url


# --------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------

_DURATION_HELP: Final = "(use 250ms, 1.5s, 2m, PT0.25S or seconds)"
_NUMBER: Final = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_BARE_SECONDS: Final = re.compile(_NUMBER)
# Go-style, so "1m30s" works as it does in Kubernetes manifests, and "500µs"
# as Knative writes its BACKOFF_DELAY (Go's time.Duration.String()).
_GO_UNITS: Final = r"ns|us|µs|μs|ms|s|m|h"
_UNIT_PART: Final = re.compile(rf"({_NUMBER})({_GO_UNITS})")
_UNIT_DURATION: Final = re.compile(rf"(?:{_NUMBER}(?:{_GO_UNITS}))+")
_ISO_NUMBER: Final = r"[0-9]+(?:[.,][0-9]+)?"
_ISO_DURATION: Final = re.compile(
    rf"P(?:(?P<W>{_ISO_NUMBER})W)?(?:(?P<D>{_ISO_NUMBER})D)?"
    rf"(?:T(?:(?P<H>{_ISO_NUMBER})H)?(?:(?P<M>{_ISO_NUMBER})M)?(?:(?P<S>{_ISO_NUMBER})S)?)?"
)
_ISO_CALENDAR: Final = re.compile(r"P[^T]*[YM]")
_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_ISO_SECONDS: Final = {"W": 604800.0, "D": 86400.0, "H": 3600.0, "M": 60.0, "S": 1.0}


def parse_duration(value: object, key: str) -> float:
    """Seconds from ``250ms``, ``1.5s``, ``1m30s``, ``PT0.25S``, ``P1DT2H`` or a number.

    Raises ``ConfigError(key, ...)`` for anything else, negative or non-finite.
    """
    try:
        seconds = _duration_seconds(value, key)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigError(key, f"must be a finite duration, got {_show(value)}")
    if seconds < 0:
        raise ConfigError(key, "must be >= 0")
    return seconds + 0.0  # turns "-0s" into 0.0, not -0.0


def _positive_duration(value: object, key: str) -> float:
    seconds = parse_duration(value, key)
    if seconds <= 0:
        raise ConfigError(key, "must be > 0")
    return seconds


def _duration_seconds(value: object, key: str) -> float:
    if isinstance(value, bool) or value is None:
        raise ConfigError(key, f"invalid duration {_show(value)} {_DURATION_HELP}")
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a duration {_DURATION_HELP}, got {_show(value)}")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("-", "+") else text
    if _BARE_SECONDS.fullmatch(body):
        return sign * float(body)
    if _UNIT_DURATION.fullmatch(body):
        return sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in _UNIT_PART.findall(body))
    iso = _iso_seconds(body)
    if iso is not None:
        return sign * iso
    if _ISO_CALENDAR.match(body):
        raise ConfigError(
            key,
            f"invalid duration {_show(value)}: ISO-8601 years and months have no fixed "
            "length; use days (P1D) or smaller units",
        )
    raise ConfigError(key, f"invalid duration {_show(value)} {_DURATION_HELP}")


def _iso_seconds(text: str) -> float | None:
    match = _ISO_DURATION.fullmatch(text)
    if match is None:
        return None
    parts = {unit: number for unit, number in match.groupdict().items() if number is not None}
    # "P" and "PT" match the pattern but say nothing; "P1DT" has a dangling T.
    time_given = any(unit in parts for unit in "HMS")
    if not parts or ("T" in text and not time_given):
        return None
    return sum(float(number.replace(",", ".")) * _ISO_SECONDS[u] for u, number in parts.items())


# --------------------------------------------------------------------------
# The rule table: what every key accepts, as data
# --------------------------------------------------------------------------
#
# The loader reads each key with its rule's ``parse``; ``dispatcher.config_schema``
# turns the same rules into the Helm chart's JSON Schema (``schema``), so the two
# cannot drift apart. A rule's schema may accept more than the service (JSON
# Schema cannot say "a duration string of at least 1s"), never less.

JsonSchema = dict[str, Any]


@dataclass(frozen=True)
class Rule:
    """One key: the parser the loader calls and the JSON Schema saying the same."""

    parse: Callable[[object, str], Any]
    schema: JsonSchema

    def read(self, s: _Section, f: Field[Any]) -> Any:
        if f.default is MISSING and f.default_factory is MISSING:
            return s.require(f.name, self.parse)
        if f.default is None:
            return s.optional(f.name, self.parse)
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        return s.get(f.name, self.parse, default)


@dataclass(frozen=True)
class SectionRule(Rule):
    """A nested mapping: ``shape``'s fields, each with its own rule."""

    shape: type = object

    def read(self, s: _Section, f: Field[Any]) -> Any:
        if f.default is None:  # ``declare: null`` (or absent) means "no section"
            return s.optional(f.name, self.parse)
        return s.nested(f.name, self.parse)  # null or absent: every default


def _section_rule(shape: type) -> SectionRule:
    return SectionRule(partial(_build, shape), {}, shape)


@dataclass(frozen=True)
class ListRule(Rule):
    """A list of ``item`` sections; required, whatever the field's default says
    (a service with no binding has nothing to do)."""

    item: SectionRule | None = None

    def read(self, s: _Section, f: Field[Any]) -> Any:
        return self.parse(s.raw(f.name), s.sub(f.name))


def _bindings_rule() -> ListRule:
    schema = {"type": "array", "minItems": 1}
    return ListRule(_bindings, schema, _section_rule(BindingSettings))


def _text(*, non_empty: bool = False, max_bytes: int | None = None) -> Rule:
    schema: JsonSchema = {"type": "string"}
    if non_empty:
        schema["minLength"] = 1
    if max_bytes is not None:
        schema["maxLength"] = max_bytes  # characters <= bytes: never refuses a valid name
    parse = _queue_name if max_bytes is not None else _non_empty_str if non_empty else _str
    return Rule(parse, schema)


def _integer(minimum: int, maximum: int | None = None) -> Rule:
    if maximum is None:
        return Rule(_int_at_least(minimum), {"type": "integer", "minimum": minimum})
    schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    return Rule(_int_between(minimum, maximum), schema)


def _any_case(word: str) -> str:
    # No (?i): JSON Schema patterns are ECMA-262, Helm's are Go's; both read [xX].
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


def _choice_rule(
    *options: str, lower: bool = False, aliases: Mapping[str, str] | None = None
) -> Rule:
    parse = _choice(*options, lower=lower, aliases=aliases)
    words = [*options, *(aliases or {})]
    if not lower:
        return Rule(parse, {"enum": words})
    return Rule(parse, {"type": "string", "pattern": f"^({'|'.join(map(_any_case, words))})$"})


_DURATION_DOC: Final = "Duration: 250ms, 1.5s, 2m, 1m30s, ISO-8601 (PT0.25S) or a number of seconds"


def _duration_pattern() -> str:
    """The strings ``parse_duration`` reads, from its own regular expressions
    (named groups unnamed: Go's and ECMA-262's syntaxes differ there)."""
    iso = re.sub(r"\(\?P<[A-Z]>", "(", _ISO_DURATION.pattern)
    forms = "|".join((_NUMBER, _UNIT_DURATION.pattern, iso))
    return rf"^\s*[-+]?({forms})\s*$"


def _duration_rule(
    parse: Callable[[object, str], float],
    minimum: float,
    *,
    positive: bool = False,
    maximum: float | None = None,
) -> Rule:
    number: JsonSchema = {"type": "number"}
    text: JsonSchema = {"type": "string", "pattern": _duration_pattern()}
    if positive:
        number["exclusiveMinimum"] = minimum
        # "0s", "PT0S", "0.000": no digit but 0 means zero, which is refused.
        text = {"allOf": [text, {"pattern": "[1-9]"}]}
    else:
        number["minimum"] = minimum
    if maximum is not None:
        number["maximum"] = maximum
    return Rule(parse, {"description": _DURATION_DOC, "anyOf": [number, text]})


def _size_rule() -> Rule:
    units = "|".join(_any_case(u) for u in sorted(_SIZE_UNITS, key=len, reverse=True) if u)
    text = {"type": "string", "pattern": rf"^\s*[0-9]*[1-9][0-9]*\s*({units})?\s*$"}
    return Rule(_size, {"anyOf": [{"type": "integer", "minimum": 1}, text]})


def _url_rule(parse: Callable[[object, str], str], *schemes: str) -> Rule:
    names = "|".join(_any_case(name) for name in schemes)
    return Rule(parse, {"type": "string", "pattern": rf"^\s*({names})://[^/?#\s]"})


def _url_list_rule(parse: Callable[[object, str], object], *schemes: str) -> Rule:
    one = _url_rule(_amqp_url, *schemes).schema
    return Rule(parse, {"anyOf": [one, {"type": "array", "minItems": 1, "items": one}]})


_FILE: Final = Rule(_existing_file, {"type": "string", "minLength": 1})


def _attributes_schema(*, non_empty: bool) -> JsonSchema:
    value: JsonSchema = {"type": "string", "minLength": 1} if non_empty else {"type": "string"}
    schema: JsonSchema = {
        "type": "object",
        "propertyNames": {"pattern": f"^{_ATTRIBUTE_NAME.pattern}$"},
        "additionalProperties": value,
    }
    return {**schema, "minProperties": 1} if non_empty else schema


# JSON Schema without references cannot recurse: the schema checks this many
# levels of all/any/not, and the service checks any deeper ones at start.
_FILTER_SCHEMA_DEPTH: Final = 2


def _filter_entry_schema(depth: int = _FILTER_SCHEMA_DEPTH) -> JsonSchema:
    if depth == 0:
        return {"type": "object"}
    inner = _filter_entry_schema(depth - 1)
    nested = {"type": "array", "minItems": 1, "items": inner}
    match = _attributes_schema(non_empty=True)
    return {
        "type": "object",
        "minProperties": 1,
        "maxProperties": 1,
        "additionalProperties": False,
        "properties": {
            "exact": match,
            "prefix": match,
            "suffix": match,
            "all": nested,
            "any": nested,
            "not": inner,
        },
    }


_TLS: Final = _section_rule(TlsSettings)

_RULES: Final[Mapping[type, Mapping[str, Rule]]] = {
    Settings: {
        "broker": _section_rule(BrokerSettings),
        "http": _section_rule(HttpSettings),
        "shutdown": _section_rule(ShutdownSettings),
        "logging": _section_rule(LoggingSettings),
        "dedupe": _section_rule(DedupeSettings),
        "bindings": _bindings_rule(),
    },
    BatchSettings: {
        "broker": _section_rule(BrokerSettings),
        "logging": _section_rule(LoggingSettings),
    },
    BrokerSettings: {
        "url": _url_list_rule(_amqp_urls, "amqp", "amqps"),
        "heartbeat": _duration_rule(_heartbeat, 1, maximum=65535),
        "connection_name": _text(non_empty=True),
        "tls": _TLS,
        "reconnect": _section_rule(ReconnectSettings),
        "blocked_timeout": _duration_rule(_positive_duration, 0, positive=True),
    },
    DedupeSettings: {"store": _url_rule(_redis_url, "redis", "rediss")},
    TlsSettings: {"ca_file": _FILE, "cert_file": _FILE, "key_file": _FILE},
    AttributesFilter: {"attributes": Rule(_filter_attributes, _attributes_schema(non_empty=False))},
    AuthSettings: {"bearer_token_file": Rule(_token_file, {"type": "string", "minLength": 1})},
    ReconnectSettings: {
        # Exponential backoff from 0 stays at 0: a tight reconnect loop.
        "initial_delay": _duration_rule(_positive_duration, 0, positive=True),
        "max_delay": _duration_rule(parse_duration, 0),
    },
    HttpSettings: {
        "listen": Rule(
            _listen, {"type": "string", "pattern": r"^(\[[^\]]+\]|[^:\[][^:]*|):[0-9]+$"}
        )
    },
    ShutdownSettings: {"grace": _duration_rule(parse_duration, 0)},
    LoggingSettings: {
        "level": _choice_rule(
            "debug", "info", "warning", "error", lower=True, aliases=_LOG_LEVEL_ALIASES
        ),
        "format": _choice_rule("json", "console", lower=True),
    },
    BindingSettings: {
        "name": Rule(_binding_name, {"type": "string", "pattern": f"^{_BINDING_NAME.pattern}$"}),
        "queue": _text(non_empty=True, max_bytes=255),  # AMQP 0-9-1 shortstr limit
        "subscriber": _url_rule(_http_url, "http", "https"),
        "declare": _section_rule(DeclareSettings),
        "content_mode": _choice_rule("binary", "structured"),
        "tls": _TLS,
        # The prefetch count is an AMQP short (and 0 would mean "unlimited").
        "parallelism": _integer(1, 65535),
        "ordered": Rule(_bool, {"type": "boolean"}),
        "delivery": _section_rule(DeliverySettings),
        "auth": _section_rule(AuthSettings),
        "headers": Rule(
            _headers,
            {
                "type": "object",
                "propertyNames": {
                    "pattern": f"^{_HEADER_NAME.pattern}$",
                    "not": {"pattern": "^([cC][eE]-|[cC][oO][nN][tT][eE][nN][tT]-)"},
                },
                "additionalProperties": {
                    "anyOf": [
                        {"type": "string", "pattern": f"^{_HEADER_VALUE.pattern}$"},
                        {"type": "integer"},
                    ]
                },
            },
        ),
        "filter": _section_rule(AttributesFilter),
        "filters": Rule(_filters, {"type": "array", "items": _filter_entry_schema()}),
        "dedupe_window": _duration_rule(parse_duration, 0),
        "dead_letter": _section_rule(DeadLetterSettings),
        "reply": _section_rule(ReplySettings),
        "non_cloudevent": _choice_rule("wrap", "dead_letter"),
        "max_body_size": _size_rule(),
    },
    DeclareSettings: {
        "durable": Rule(_bool, {"type": "boolean"}),
        "type": _choice_rule("classic", "quorum"),
        "dead_letter_exchange": _text(),
        "delivery_limit": _integer(1),
    },
    DeliverySettings: {
        "retry": _integer(0),
        "backoff_policy": _choice_rule("exponential", "linear"),
        # 0 would requeue a refused message straight back, in a hot loop.
        "backoff_delay": _duration_rule(_positive_duration, 0, positive=True),
        "backoff_max": _duration_rule(parse_duration, 0),
        "timeout": _duration_rule(_positive_duration, 0, positive=True),
        "retry_on": Rule(
            _retry_on,
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
    },
    DeadLetterSettings: {
        "sink": _url_rule(_http_url, "http", "https"),
        "exchange": _text(),
        "routing_key": _text(),
    },
    ReplySettings: {
        "exchange": _text(),
        "routing_key": _text(),
        "url": _url_rule(_http_url, "http", "https"),
    },
}

_CHECKS: Final[Mapping[type, Callable[[Any, _Section], None]]] = {
    BrokerSettings: _check_broker,
    ReconnectSettings: _check_reconnect,
    TlsSettings: _check_tls,
    DeclareSettings: _check_declare,
    DeliverySettings: _check_delivery,
    ReplySettings: _check_reply,
    BindingSettings: _check_binding,
}


def rule_table() -> Mapping[type, Mapping[str, Rule]]:
    """Every section's rules, for ``dispatcher.config_schema``."""
    return _RULES


# --------------------------------------------------------------------------
# The effective configuration (what `dispatcher check` prints)
# --------------------------------------------------------------------------

# PRODUCT.md lists `declare` before `subscriber`; dataclass field order cannot,
# because required fields must come first.
_BINDING_KEY_ORDER: Final = (
    "name",
    "queue",
    "declare",
    "subscriber",
    "content_mode",
    "tls",
    "parallelism",
    "ordered",
    "delivery",
    "auth",
    "headers",
    "filter",
    "filters",
    "dedupe_window",
    "dead_letter",
    "reply",
    "non_cloudevent",
    "max_body_size",
)


def effective_config(settings: Settings) -> dict[str, object]:
    """Every setting as plain data, in the file's own notation, passwords redacted."""
    effective = _plain(settings)
    effective["bindings"] = [
        {key: binding[key] for key in _BINDING_KEY_ORDER}
        for binding in (_plain(b) for b in settings.bindings)
    ]
    return effective


def render_effective_config(settings: Settings) -> str:
    """``effective_config`` as YAML, keys in PRODUCT.md order."""
    return yaml.safe_dump(
        effective_config(settings), sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def _plain(obj: DataclassInstance) -> dict[str, object]:
    plain: dict[str, object] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        plain[f.name] = _render(value, f.metadata.get("render"))
    return plain


def _render(value: object, how: str | None) -> object:
    if how in _WHOLE:  # a tuple shown as a whole, as it was written
        return _RENDERERS[how](value)
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(value)
    if isinstance(value, tuple):
        return [_render(item, how) for item in value]
    render = _RENDERERS.get(how or "")
    return value if render is None or value is None else render(value)


_SECRET_HEADER: Final = re.compile(r"auth|token|secret|key|password|cookie|signature", re.I)


def _render_header(name: str, value: str) -> str:
    """``check`` shows header values, except those whose name says they are secret."""
    return "<redacted>" if _SECRET_HEADER.search(name) else value


def _render_filter(entry: FilterEntry) -> dict[str, object]:
    if isinstance(entry, MatchFilter):
        return {entry.dialect: dict(entry.attributes)}
    if entry.dialect == "not":
        return {"not": _render_filter(entry.filters[0])}
    return {entry.dialect: [_render_filter(nested) for nested in entry.filters]}


def _render_duration(seconds: float) -> str | float:
    millis = round(seconds * 1000)
    if not math.isclose(millis, seconds * 1000, rel_tol=0, abs_tol=1e-6):
        return seconds  # not a whole number of milliseconds: plain seconds is exact
    if millis == 0:
        return "0s"
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if millis % size == 0:
            return f"{millis // size}{unit}"
    return f"{millis}ms"


def _render_size(size: int) -> str | int:
    for unit, factor in (("MiB", 1024**2), ("KiB", 1024)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return size


_RENDERERS: Final[Mapping[str, Callable[[Any], object]]] = {
    "duration": _render_duration,
    "url": redact_url,
    "size": _render_size,
    "headers": lambda pairs: {name: _render_header(name, value) for name, value in pairs},
    "mapping": dict,
    "filters": lambda entries: [_render_filter(entry) for entry in entries],
}
_WHOLE: Final = frozenset({"headers", "mapping", "filters"})


def _show(value: object) -> str:
    """A value for an error message: strings quoted and redacted, containers by kind."""
    if isinstance(value, str):
        # The value may be a URL without its scheme (RABBITMQ_URL=user:pw@host).
        text = redact_url(value)
        return repr(text if len(text) <= 80 else text[:77] + "...")
    if value is None or isinstance(value, bool):
        return json.dumps(value)  # null / true / false, as the user wrote them in YAML
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."
    if isinstance(value, Mapping):
        return "mapping"
    return "list" if isinstance(value, list | tuple) else type(value).__name__
