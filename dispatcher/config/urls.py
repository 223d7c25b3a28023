"""URLs: the broker's (amqp, amqps), the dedupe store's (redis, rediss) and the
HTTP ones (subscriber, dead-letter sink, reply URL).

Each must mean one thing to everyone who reads it. A URL that the library
using it (pika, libcurl, redis-py) would read differently from how this
configuration and every log line show it is refused, with the reason:
an ``@`` after the host, characters RFC 3986 does not allow unencoded, hosts
curl reads as numbers, query parameters pika refuses (``amqp``). Passwords in
them are shown only redacted (``redaction``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit

from dispatcher.config.redaction import SCHEME, redact_url, show
from dispatcher.config.values import string
from dispatcher.errors import ConfigError

_NODE_SEPARATOR: Final = re.compile(r"\s*,\s*(?=amqps?://)", re.IGNORECASE)


def split_nodes(urls: str) -> list[str]:
    """Comma-separated broker URLs (``RABBITMQ_URL``) as a list. Only a comma before
    ``amqp://`` or ``amqps://`` separates nodes: a password may hold commas."""
    return [part.strip() for part in _NODE_SEPARATOR.split(urls)]


def amqp_urls(value: object, key: str) -> str | tuple[str, ...]:
    """``broker.url``: one URL, or a cluster's nodes as a list or comma-separated.
    Only a comma before ``amqp://`` or ``amqps://`` separates nodes: a password
    may hold commas (and a split inside it would show its first half)."""
    if isinstance(value, str) and _NODE_SEPARATOR.search(value):
        value = split_nodes(value)
    if not isinstance(value, list):
        return amqp_url(value, key)
    if not value:
        raise ConfigError(key, "must name at least one node")
    urls = tuple(amqp_url(item, f"{key}[{index}]") for index, item in enumerate(value))
    return urls[0] if len(urls) == 1 else urls


def amqp_url(value: object, key: str) -> str:
    # Its query parameters (?heartbeat=, ?channel_max=) and virtual host are
    # pika's to read: ``dispatcher.resolve`` reads it with pika before
    # anything starts, ``check`` included.
    return _url(value, key, ("amqp", "amqps"), "an amqp(s) URL")


def redis_url(value: object, key: str) -> str:
    url = _url(value, key, ("redis", "rediss"), "a redis(s) URL")
    database = urlsplit(url).path.strip("/")
    if database and not database.isdigit():
        raise ConfigError(key, f"the path must be a database number, got {show(url)}")
    return url


def http_url(value: object, key: str) -> str:
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
    url = string(value, key)
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0  # .port raises on junk
    except ValueError:
        raise ConfigError(key, f"must be {what}, got {show(url)}") from None
    if parts.scheme.lower() not in schemes:
        raise ConfigError(key, f"must be {what}, got {show(url)}")
    if not parts.hostname:
        raise ConfigError(key, f"must be {what} with a host, got {show(url)}")
    if not port_ok:
        raise ConfigError(key, f"must be {what} with a port in 1..65535, got {show(url)}")
    if _at_after_authority(url):
        # amqp://user:12/ss@host/ connects to host "user", port 12, while every
        # redacted rendering shows amqp://user:***@host/: refuse the ambiguity.
        raise ConfigError(
            key,
            f"must be {what} without an '@' after the host (percent-encode '/', '?', '#' "
            f"and '@' in a password as %2F, %3F, %23, %40), got {show(url)}",
        )
    return url


def _at_after_authority(url: str) -> bool:
    """True when ``redact_url`` would mask past the RFC 3986 authority: a ``:``
    then an ``@`` in the path, query or fragment, read here as a password."""
    scheme = SCHEME.search(url)
    start = scheme.end() if scheme is not None else 0
    authority_end = min((i for i in map(url.find, "/?#", [start] * 3) if i >= 0), default=len(url))
    return url.rfind("@") > authority_end and redact_url(url) != url
