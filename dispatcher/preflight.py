"""What the configuration cannot check without the sides' libraries, checked
before anything starts (``dispatcher check`` included): each broker URL as
pika reads it (its query parameters; an ``ssl_options`` mapping builds a TLS
context from the files it names) and that a cluster's nodes share one virtual
host; the TLS files pika and libcurl will load; the proxy each HTTP URL of a
binding will go through, read as the HTTP side reads it; and the dedupe
store's URL as redis-py reads it. So ``check`` accepts exactly what ``run``
can start with. The configuration loader runs these inside its own error
naming: a value that came from a variable is blamed on the variable.
"""

from __future__ import annotations

import os
import ssl

import pika

from dispatcher.config import BatchSettings, BindingSettings, BrokerSettings, Settings, TlsSettings
from dispatcher.config.redaction import show
from dispatcher.errors import ConfigError
from dispatcher.http.endpoint import endpoint
from dispatcher.tls import tls_context


def check_service(settings: Settings) -> None:
    check_broker(settings.broker)
    for index, binding in enumerate(settings.bindings):
        _loads(binding.tls, f"bindings[{index}].tls")
        _endpoints(index, binding)
    if settings.dedupe.store is not None:
        _store_url(settings.dedupe.store)


def check_batch(settings: BatchSettings) -> None:
    check_broker(settings.broker)


def check_broker(broker: BrokerSettings) -> None:
    urls = broker.urls
    hosts = set()
    for index, url in enumerate(urls):
        key = "broker.url" if isinstance(broker.url, str) else f"broker.url[{index}]"
        try:
            hosts.add(pika.URLParameters(url).virtual_host)
        except Exception as e:  # ValueError, TypeError, OSError or ssl's errors
            raise ConfigError(key, f"invalid connection parameter in {show(url)}: {e}") from None
    if len(hosts) > 1:
        raise ConfigError("broker.url", "every node of one cluster must name the same virtual host")
    if any(url.lower().startswith("amqps://") or "ssl_options" in url for url in urls):
        _loads(broker.tls, "broker.tls")  # what every amqps connection is wrapped in


def _endpoints(index: int, binding: BindingSettings) -> None:
    """Each URL of the binding with the proxy the environment names for it, read
    as the service will read it (a proxy variable that is not a proxy URL)."""
    urls = {
        "subscriber": binding.subscriber,
        "dead_letter.sink": binding.dead_letter.sink,
        "reply.url": binding.reply.url,
    }
    for key, url in urls.items():
        if url is not None:
            endpoint(url, binding.tls, os.environ, f"bindings[{index}].{key}")


def _loads(tls: TlsSettings, key: str) -> None:
    try:
        tls_context(tls)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(key, f"cannot load: {e}") from e


def _store_url(url: str) -> None:
    # Imported only with a store: redis-py is 8 MB a replica without one never needs.
    import redis

    try:
        redis.Redis.from_url(url)  # reads the URL and its query; connects to nothing
    except ValueError as e:
        raise ConfigError("dedupe.store", str(e)) from e
