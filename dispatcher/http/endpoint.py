"""Where a request goes: a URL with its TLS files and the proxy the environment names.

Fixed at start-up, one per URL of a binding (subscriber, dead-letter sink,
reply URL); the HTTP client pools its connections per ``Endpoint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from dispatcher.config import TlsSettings, redact_url
from dispatcher.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One URL and what every request to it shares, fixed at start-up."""

    url: str
    tls: TlsSettings = field(default_factory=TlsSettings)
    proxy: str = ""  # "" = no proxy
    no_proxy: str = ""
    # The key of its handle pool, looked up twice per request: hashed once.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.url, self.tls, self.proxy, self.no_proxy)))

    def __hash__(self) -> int:
        return self._hash


_PROXY_SCHEMES: Final = ("http", "https", "socks4", "socks4a", "socks5", "socks5h")


def endpoint(url: str, tls: TlsSettings, environ: Mapping[str, str], key: str) -> Endpoint:
    """``url`` with its proxy taken from the environment, the way curl and httpx read it:
    ``https_proxy``/``HTTPS_PROXY`` for https URLs, ``http_proxy``/``HTTP_PROXY`` for
    http ones, else ``all_proxy``/``ALL_PROXY``; ``no_proxy``/``NO_PROXY`` lists the
    hosts reached directly (curl's matching: domain suffixes, addresses, CIDR, ``*``).
    The lower-case name wins. A proxy that is not a proxy URL is a ``ConfigError``
    naming the variable; ``key`` names the URL's config key. So is one with a
    space, a control or a non-ASCII character (a password pasted without
    percent-encoding): curl refuses it at every request, quoting it whole, and
    pycurl cannot even hand it over when it is not ASCII."""
    scheme = urlsplit(url).scheme.lower()
    proxy, variable = "", ""
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY", "all_proxy", "ALL_PROXY"):
        if environ.get(name, "").strip():
            proxy, variable = environ[name].strip(), name
            break
    if proxy:
        if "://" not in proxy:
            proxy = "http://" + proxy  # as curl reads a bare host:port
        try:
            parts = urlsplit(proxy)
            valid = parts.scheme.lower() in _PROXY_SCHEMES and bool(parts.hostname)
            valid = valid and (parts.port is None or parts.port > 0)
        except ValueError:
            valid = False
        if not valid:
            raise ConfigError(variable, f"must be a proxy URL for {key}, got {redact_url(proxy)!r}")
        if not (proxy.isascii() and proxy.isprintable()) or " " in proxy:
            raise ConfigError(
                variable,
                f"must be a proxy URL for {key} with its user and password percent-encoded "
                f"(no spaces, control or non-ASCII characters), got {redact_url(proxy)!r}",
            )
    no_proxy = (environ.get("no_proxy") or environ.get("NO_PROXY") or "").strip()
    return Endpoint(url, tls, proxy, no_proxy)
