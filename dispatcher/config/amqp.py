"""What pika will make of a broker URL, read without pika.

The broker side connects with ``pika.URLParameters(url)``, which takes the
virtual host from the URL's path and up to a dozen connection parameters from
its query (``?heartbeat=30&channel_max=64``). A URL pika refuses must be
refused when the configuration is loaded, naming the key, not at every
connect; and every node of one cluster must name the same virtual host. The
configuration package stays free of pika, so this module reads a URL as pika 1.x
does, step by step, raising the exception pika raises with the same message.
``tests/unit/test_config_amqp.py`` compares the two on many URLs.

One check needs the ``ssl`` module and is left to pika: an ``ssl_options``
query value that is a mapping naming CA files, a protocol, a certificate or
ciphers builds an ``ssl.SSLContext`` from them. Such a mapping is accepted
here; ``dispatcher.preflight`` reads the URL with pika before anything starts
(``check`` included), so it is refused with pika's own message all the same. (What
the service connects with is ``broker.tls`` in any case: the broker side
replaces the URL's TLS context with one built from it.)
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any, Final
from urllib.parse import ParseResult, parse_qs, unquote, urlparse

DEFAULT_VIRTUAL_HOST: Final = "/"
# pika's limits (pika.channel.MAX_CHANNELS, pika.spec.FRAME_MIN_SIZE and FRAME_MAX_SIZE).
_MAX_CHANNELS: Final = 65535
_FRAME_MIN_SIZE: Final = 4096
_FRAME_MAX_SIZE: Final = 131072


def virtual_host(url: str) -> str:
    """The virtual host pika connects to: the path's first segment, unquoted
    (``%2F`` is ``/``), or ``/`` when the path names none."""
    path = _parts(url).path
    return unquote(path.split("/")[1]) if len(path) > 1 else DEFAULT_VIRTUAL_HOST


def check_url(url: str) -> None:
    """Raise what ``pika.URLParameters(url)`` raises (the same type and message),
    or return when pika would accept ``url``."""
    parts = _parts(url)
    if parts.scheme not in ("http", "https", ""):
        raise ValueError(
            f"Unexpected URL scheme {parts.scheme!r}; supported scheme values: amqp, amqps"
        )
    secure = parts.scheme == "https"
    _ = parts.port  # raises ValueError for a port that is not one
    if parts.username is not None:
        # pika unquotes the password even when there is none: a user name
        # without one fails there, with urllib's TypeError. So does this.
        unquote(parts.password)  # type: ignore[arg-type]
    for name, values in parse_qs(parts.query).items():
        setter = _SETTERS.get(name)
        if setter is None:
            raise ValueError(f"Unknown URL parameter: {name!r}")
        if len(values) != 1:
            raise ValueError(
                f"Expected exactly one value for URL parameter {name}, "
                f"but got {len(values)} values: {values}"
            )
        setter(values[0], secure)


def _parts(url: str) -> ParseResult:
    # pika reads amqp(s) as http(s), so that urllib splits the URL as a web URL
    # (a ";params" suffix of the last path segment included).
    if url[0:4].lower() == "amqp":
        url = "http" + url[4:]
    return urlparse(url)


# --------------------------------------------------------------------------
# The query parameters, each read and checked as pika's setter for it does
# --------------------------------------------------------------------------


def _number(name: str, value: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(value)
    except ValueError as exc:
        raise ValueError(f"Invalid {name} value {value!r}: {exc!r}") from None


def _channel_max(value: str, secure: bool) -> None:
    number = _number("channel_max", value, int)
    if number < 1 or number > _MAX_CHANNELS:
        raise ValueError(f"channel_max must be <= {_MAX_CHANNELS} and > 0, but got {number!r}")


def _connection_attempts(value: str, secure: bool) -> None:
    number = _number("connection_attempts", value, int)
    if number < 1:
        raise ValueError(f"connection_attempts must be > 0, but got {number!r}")


def _frame_max(value: str, secure: bool) -> None:
    number = _number("frame_max", value, int)
    if number < _FRAME_MIN_SIZE:
        raise ValueError(f"Min AMQP 0.9.1 Frame Size is {_FRAME_MIN_SIZE}, but got {number!r}")
    if number > _FRAME_MAX_SIZE:
        raise ValueError(f"Max AMQP 0.9.1 Frame Size is {_FRAME_MAX_SIZE}, but got {number!r}")


def _heartbeat(value: str, secure: bool) -> None:
    number = _number("heartbeat", value, int)
    if number < 0:
        raise ValueError(f"heartbeat must >= 0, but got {number!r}")


def _blocked_connection_timeout(value: str, secure: bool) -> None:
    number = _number("blocked_connection_timeout", value, float)
    if number < 0:
        raise ValueError(f"blocked_connection_timeout must be >= 0, but got {number!r}")


def _retry_delay(value: str, secure: bool) -> None:
    _number("retry_delay", value, float)


def _timeout(name: str) -> Callable[[str, bool], None]:
    def check(value: str, secure: bool) -> None:
        number = _number(name, value, float)
        if number <= 0:
            raise ValueError(f"{name} must be > 0, but got {number!r}")

    return check


def _locale(value: str, secure: bool) -> None:
    pass  # any string


def _client_properties(value: str, secure: bool) -> None:
    properties = ast.literal_eval(value)
    if not isinstance(properties, dict | None):
        raise TypeError(f"client_properties must be dict or None, but got {properties!r}")


def _tcp_options(value: str, secure: bool) -> None:
    options = ast.literal_eval(value)
    if not isinstance(options, dict | None):
        raise TypeError(f"tcp_options must be a dict or None, but got {options!r}")


def _ssl_options(value: str, secure: bool) -> None:
    # The same operations as pika, in its order, on the value Python reads:
    # each raises here what it raises there.
    options: Any = ast.literal_eval(value)
    if options is None:
        if secure:
            raise ValueError(
                "Specified ssl_options=None URI arg is inconsistent with "
                "the specified amqps URI scheme."
            )
        return
    if "protocol" in options:  # a number cannot hold a key: TypeError
        options["protocol"]  # a string, list or set holding "protocol": TypeError
        return  # a mapping: an ssl.SSLContext for that protocol, left to pika
    locations = (
        options.get("ca_certs") or options.get("cafile"),  # not a mapping: AttributeError
        options.get("ca_path") or options.get("capath"),
        options.get("ca_data") or options.get("cadata"),
    )
    if all(location is None for location in locations):
        # ssl.SSLContext.load_verify_locations(None, None, None)
        raise TypeError("cafile, capath and cadata cannot be all omitted")
    # CA files to load (and perhaps a certificate, ciphers): left to pika.


_SETTERS: Final[Mapping[str, Callable[[str, bool], None]]] = {
    "blocked_connection_timeout": _blocked_connection_timeout,
    "channel_max": _channel_max,
    "client_properties": _client_properties,
    "connection_attempts": _connection_attempts,
    "frame_max": _frame_max,
    "heartbeat": _heartbeat,
    "locale": _locale,
    "retry_delay": _retry_delay,
    "socket_timeout": _timeout("socket_timeout"),
    "stack_timeout": _timeout("stack_timeout"),
    "ssl_options": _ssl_options,
    "tcp_options": _tcp_options,
}
