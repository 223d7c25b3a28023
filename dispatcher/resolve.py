"""One resolve step for ``check`` and ``run``: what the settings name, read and
loaded the way the service will use it.

The configuration package reads values and connects to nothing; what only
the sides' libraries can read is read here, before anything starts: each
broker URL as pika reads it (its query parameters; an ``ssl_options`` mapping
builds a TLS context from the files it names) and that a cluster's nodes
share one virtual host; the TLS files pika and libcurl will load; each HTTP
URL of a binding with the proxy the environment names for it; the bearer
token file; the dedupe store's URL as redis-py reads it.

``check`` and ``run`` call the same ``resolve`` (the configuration loader runs
it inside its own error naming, so a value that came from a variable is
blamed on the variable), and ``run`` builds the service from what it returns:
whatever ``run`` would refuse at start, ``check`` refuses with the same
message, and nothing is loaded twice.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import pika

from dispatcher.config import BatchSettings, BindingSettings, BrokerSettings, Settings, TlsSettings
from dispatcher.config.redaction import show
from dispatcher.credentials.bearer import BearerToken
from dispatcher.credentials.tls import EncryptedKey, tls_context
from dispatcher.errors import ConfigError, TokenFileError
from dispatcher.http.endpoint import Endpoint, endpoint


@dataclass(frozen=True, slots=True)
class BindingEndpoints:
    """A binding's URLs as the HTTP client uses them, and its token."""

    subscriber: Endpoint
    sink: Endpoint | None
    reply: Endpoint | None
    bearer: BearerToken | None  # one token, kept current, for all three


@dataclass(frozen=True, slots=True)
class Resolved:
    """What ``run`` builds the service from, besides the settings."""

    bindings: tuple[BindingEndpoints, ...]


def resolve(settings: Settings) -> Resolved:
    """Everything the service's settings name, read now; a ``ConfigError`` naming
    the key for the first thing that cannot be."""
    check_broker(settings.broker)
    bindings = tuple(_binding(index, b) for index, b in enumerate(settings.bindings))
    if settings.dedupe.store is not None:
        _store_url(settings.dedupe.store)
    return Resolved(bindings)


def check_batch(settings: BatchSettings) -> None:
    check_broker(settings.broker)


def check_broker(broker: BrokerSettings) -> None:
    urls = broker.urls
    hosts = set()
    for index, url in enumerate(urls):
        key = "broker.url" if isinstance(broker.url, str) else f"broker.url[{index}]"
        if _user_without_password(url):
            # pika's own error says "argument of type 'NoneType' is not iterable".
            raise ConfigError(
                key, f"{show(url)} names a user without a password: write user:password@host"
            )
        try:
            hosts.add(pika.URLParameters(url).virtual_host)
        except Exception as e:  # ValueError, TypeError, OSError or ssl's errors
            raise ConfigError(key, f"invalid connection parameter in {show(url)}: {e}") from None
        if "ssl_options" in parse_qs(urlsplit(url).query):
            # Every amqps connection is wrapped in broker.tls's context: the URL's
            # would be replaced without a word, and its CA or name never used.
            raise ConfigError(
                key,
                f"{show(url)}: ssl_options in the URL is not used; set broker.tls "
                "(ca_file, cert_file, key_file), which every amqps:// node uses",
            )
    if len(hosts) > 1:
        raise ConfigError("broker.url", "every node of one cluster must name the same virtual host")
    if broker.uses_tls:
        _loads(broker.tls, "broker.tls")  # what every amqps connection is wrapped in


def _user_without_password(url: str) -> bool:
    parts = urlsplit(url)
    return bool(parts.username) and parts.password is None


def _binding(index: int, binding: BindingSettings) -> BindingEndpoints:
    """Its TLS files loaded (what curl will load, checked where the error can name
    the key), each URL with the proxy the environment names for it, its token read."""
    key = f"bindings[{index}]"
    _loads(binding.tls, f"{key}.tls")

    def at(url: str | None, name: str) -> Endpoint | None:
        return None if url is None else endpoint(url, binding.tls, os.environ, f"{key}.{name}")

    subscriber = at(binding.subscriber, "subscriber")
    assert subscriber is not None
    return BindingEndpoints(
        subscriber,
        at(binding.dead_letter.sink, "dead_letter.sink"),
        at(binding.reply.url, "reply.url"),
        _bearer(binding, f"{key}.auth.bearer_token_file"),
    )


def _bearer(binding: BindingSettings, key: str) -> BearerToken | None:
    path = binding.auth.bearer_token_file
    if path is None:
        return None
    try:
        return BearerToken(path, binding.name)
    except TokenFileError as e:
        raise ConfigError(key, f"no token in {path}: {e}") from e


def _loads(tls: TlsSettings, key: str) -> None:
    try:
        tls_context(tls)
    except (OSError, ssl.SSLError, EncryptedKey) as e:
        raise ConfigError(key, f"cannot load: {e}") from e


def _store_url(url: str) -> None:
    # Imported only with a store: redis-py is 8 MB a replica without one never needs.
    import redis
    from redis.connection import parse_url

    from dispatcher.store.redis_claims import CALL_TIMEOUT

    try:
        # redis-py lets the URL's query override the client's keywords: these two
        # would lift the bound that keeps a store that does not answer from
        # holding deliveries (the loop's own limit is four times longer).
        bounds = sorted({"socket_timeout", "socket_connect_timeout"} & set(parse_url(url)))  # type: ignore[no-untyped-call]
        if bounds:
            raise ConfigError(
                "dedupe.store",
                f"{' and '.join(bounds)} cannot be set in the URL: every store call is "
                f"bounded by the dispatcher ({CALL_TIMEOUT}s), so that a store that does "
                "not answer never holds a delivery",
            )
        pool = redis.Redis.from_url(url).connection_pool  # reads the URL and its query
        # One connection built, and not connected: a query parameter redis-py has
        # no such keyword for fails here, not on every call of the running service.
        pool.connection_class(**pool.connection_kwargs)
    except ValueError as e:
        raise ConfigError("dedupe.store", str(e)) from e
    except TypeError as e:
        raise ConfigError("dedupe.store", f"a query parameter redis-py does not take: {e}") from e
