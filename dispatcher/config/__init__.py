"""Configuration: YAML + environment -> one frozen ``Settings`` tree, validated up front.

Every error is a ``ConfigError`` naming the full key path
(``bindings[0].delivery.retry``) or, for a value that came from the
environment, the variable (``LOG_FORMAT``). Passwords never leave the
package: every URL in an error message or in ``dispatcher check``'s output is
redacted. Nothing here connects, or imports pika, libcurl or ssl: the broker
and HTTP sides build their connections from the settings.

The modules, from the data up:

``redaction``
    ``redact_url``, and ``show``: how a value appears in a message.
``values``, ``durations``, ``urls``
    Parsers for one value each, ``(value, key) -> typed value`` or a
    ``ConfigError`` naming ``key``: scalars, names, headers and filters;
    durations; broker, store and HTTP URLs.
``filter_tree``
    The ``filters`` key's entries (match, nesting, CESQL) as the service reads them.
``validation``
    ``Accepts``, what one key accepts: the parser pydantic calls, its JSON
    Schema and how ``check`` writes it back, in the key's annotation.
``settings``
    The models: every key declared once (type, what it accepts, default,
    description) and the checks between keys of one section.
``problems``
    pydantic's errors in our words: every problem of a file, each naming its
    key (or the variable its value came from).
``sources``
    Where a configuration comes from: the YAML file, the environment's
    overrides, or (``knative``) the Knative dispatcher's variables.
``render``
    The effective configuration, as ``dispatcher check`` prints it.
``advice``
    Valid settings that are probably a mistake (no dead-letter target), which
    ``check`` and ``run`` both say.
``schema``, ``reference``, ``generated``
    The Helm chart's JSON Schema and ``docs/configuration-keys.md``, generated
    from the models (``make schema``), and how such a file is refreshed.

The names below are the package's interface; the rest is for its modules.
"""

from dispatcher.config.advice import Advice, advice
from dispatcher.config.durations import parse_duration
from dispatcher.config.filter_tree import (
    CesqlFilter,
    FilterEntry,
    MatchDialect,
    MatchFilter,
    NestingDialect,
    NestingFilter,
)
from dispatcher.config.redaction import redact_url
from dispatcher.config.render import effective_config, render_effective_config
from dispatcher.config.settings import (
    UNACKED_MAX,
    AttributesFilter,
    AuthSettings,
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
from dispatcher.config.sources import (
    DEFAULT_CONFIG_PATH,
    blame_variables,
    load_batch_settings,
    load_settings,
    settings_from_dict,
)
from dispatcher.config.urls import http_url_problem, split_nodes
from dispatcher.delivery.retry import BackoffPolicy

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "UNACKED_MAX",
    "Advice",
    "AttributesFilter",
    "AuthSettings",
    "BackoffPolicy",
    "BatchSettings",
    "BindingSettings",
    "BrokerSettings",
    "CesqlFilter",
    "CircuitBreakerSettings",
    "ContentMode",
    "DeadLetterSettings",
    "DeclareSettings",
    "DedupeSettings",
    "DeliverySettings",
    "FilterEntry",
    "HttpSettings",
    "LogFormat",
    "LogLevel",
    "LoggingSettings",
    "MatchDialect",
    "MatchFilter",
    "NestingDialect",
    "NestingFilter",
    "NonCloudEvent",
    "QueueType",
    "ReconnectSettings",
    "ReplySettings",
    "Settings",
    "ShutdownSettings",
    "TlsSettings",
    "TracingSettings",
    "advice",
    "blame_variables",
    "effective_config",
    "http_url_problem",
    "load_batch_settings",
    "load_settings",
    "parse_duration",
    "redact_url",
    "render_effective_config",
    "settings_from_dict",
    "split_nodes",
]
