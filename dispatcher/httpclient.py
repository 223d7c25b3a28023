"""HTTP requests through libcurl's multi interface, driven by the engine loop.

libcurl does every part of HTTP (framing, chunked bodies, keep-alive, TLS,
proxies, Basic auth from ``user:password@``); this module only feeds it
requests and turns finished transfers into ``Response`` values. One
``CurlMulti`` serves every binding: curl tells the loop which sockets to
watch (``M_SOCKETFUNCTION``) and when to wake it (``M_TIMERFUNCTION``), so
thousands of requests can be in flight on the one engine thread.

What each request costs in Python is kept to a handful of calls: easy
handles are pooled per endpoint with everything that does not change set
once (URL, TLS files, proxy, HTTP/1.1, no redirects); a request sets only its
body, its header list and its timeout. Response header lines are collected by
``list.append`` (a C call) and parsed only when someone asks for a header.

Bodies are bounded: at most ``keep`` bytes of a response are kept, and a
body longer than ``limit`` ends the transfer there (curl stops reading; the
connection is closed). The answer is still the status the server sent, with
``truncated`` set: a 2xx with an oversized body is a delivery.

Every failure is a value: ``Response.status == -1`` with ``error`` saying
what happened (``timeout`` when the attempt's budget ran out). Nothing here
raises into the delivery code.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

import pycurl

from dispatcher.config import TlsSettings, redact_url
from dispatcher.errors import ConfigError
from dispatcher.loop import FAILED, READABLE, WRITABLE, Future, Loop, Timer

USER_AGENT: Final = "dispatcher"
# curl adds these unless told not to: a form content type on every POST
# without one, and "Expect: 100-continue" (a round trip) for large bodies.
_SUPPRESSED: Final = ("Expect:",)
_NO_CONTENT_TYPE: Final = "Content-Type:"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One URL and what every request to it shares, fixed at start-up."""

    url: str
    tls: TlsSettings = field(default_factory=TlsSettings)
    proxy: str = ""  # "" = no proxy
    no_proxy: str = ""


_PROXY_SCHEMES: Final = ("http", "https", "socks4", "socks4a", "socks5", "socks5h")


def endpoint(url: str, tls: TlsSettings, environ: Mapping[str, str], key: str) -> Endpoint:
    """``url`` with its proxy taken from the environment, the way curl and httpx read it:
    ``https_proxy``/``HTTPS_PROXY`` for https URLs, ``http_proxy``/``HTTP_PROXY`` for
    http ones, else ``all_proxy``/``ALL_PROXY``; ``no_proxy``/``NO_PROXY`` lists the
    hosts reached directly (curl's matching: domain suffixes, addresses, CIDR, ``*``).
    The lower-case name wins. A proxy that is not a proxy URL is a ``ConfigError``
    naming the variable; ``key`` names the URL's config key."""
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
    no_proxy = (environ.get("no_proxy") or environ.get("NO_PROXY") or "").strip()
    return Endpoint(url, tls, proxy, no_proxy)


@dataclass(frozen=True, slots=True)
class BodyLimit:
    """``keep``: bytes of a response body kept; ``limit``: bytes read at most."""

    keep: int
    limit: int


class Response:
    """One attempt's answer: a status with headers and (part of) the body, or -1 and why."""

    __slots__ = ("_head", "body", "error", "status", "timed_out", "truncated")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        head: list[bytes] | None = None,
        error: str | None = None,
        truncated: bool = False,
        timed_out: bool = False,
    ) -> None:
        self.status = status
        self.body = body
        self._head = head or []
        self.error = error
        self.truncated = truncated
        self.timed_out = timed_out

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names lower-cased; a repeated header keeps its last value."""
        return parse_head(self._head)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


def parse_head(lines: list[bytes]) -> dict[str, str]:
    """The headers of the final response in curl's raw header lines.

    curl hands over every header block it read (a ``100 Continue`` first, say);
    only the last one, after the last status line, is the response's.
    """
    headers: dict[str, str] = {}
    for raw in lines:
        line = raw.decode("latin-1").rstrip("\r\n")
        if line.startswith("HTTP/"):
            headers = {}
            continue
        name, sep, value = line.partition(":")
        if sep and name and not name[0].isspace():
            headers[name.strip().lower()] = value.strip()
    return headers


class _Transfer:
    """One easy handle, reused for request after request to one endpoint."""

    __slots__ = (
        "aborted",
        "body",
        "curl",
        "endpoint",
        "future",
        "head",
        "keep",
        "kept",
        "limit",
        "received",
        "truncated",
    )

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.head: list[bytes] = []
        self.body: list[bytes] = []
        self.kept = self.received = self.keep = self.limit = 0
        self.truncated = self.aborted = False
        self.future: Future[Response] | None = None
        self.curl = _easy_handle(endpoint)
        self.curl.setopt(pycurl.HEADERFUNCTION, self.head.append)
        self.curl.setopt(pycurl.WRITEFUNCTION, self._write)

    def prepare(self, body: bytes, headers: list[str], timeout: float, bounds: BodyLimit) -> None:
        self.head.clear()
        self.body.clear()
        self.kept = self.received = 0
        self.keep, self.limit = bounds.keep, bounds.limit
        self.truncated = self.aborted = False
        curl = self.curl
        curl.setopt(pycurl.POSTFIELDS, body)
        curl.setopt(pycurl.HTTPHEADER, headers)
        curl.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout * 1000)))

    def _write(self, chunk: bytes) -> int | None:
        self.received += len(chunk)
        if self.received > self.limit:
            # Never read a body past the limit: stop the transfer here.
            self.truncated = self.aborted = True
            return 0
        room = self.keep - self.kept
        if room > 0:
            piece = chunk if len(chunk) <= room else chunk[:room]
            self.body.append(piece)
            self.kept += len(piece)
        if len(chunk) > room:
            self.truncated = True
        return None

    def response(self, code: int, message: str) -> Response:
        status = int(self.curl.getinfo(pycurl.RESPONSE_CODE))
        body = b"".join(self.body) if self.body else b""
        if code == 0 or (self.aborted and code == pycurl.E_WRITE_ERROR and status):
            return Response(status, body, list(self.head), truncated=self.truncated)
        if code == pycurl.E_OPERATION_TIMEDOUT:
            return Response(-1, error="timeout", timed_out=True)
        return Response(-1, error=f"curl error {code}: {message}"[:300])


def _easy_handle(endpoint: Endpoint) -> pycurl.Curl:
    curl = pycurl.Curl()
    curl.setopt(pycurl.URL, endpoint.url)
    curl.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM-based DNS timeouts
    curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
    curl.setopt(pycurl.FOLLOWLOCATION, 0)  # a redirect is an answer (3xx), never followed
    curl.setopt(pycurl.HTTP09_ALLOWED, 0)  # garbage instead of a status line is an error
    curl.setopt(pycurl.USERAGENT, USER_AGENT)
    curl.setopt(pycurl.TCP_NODELAY, 1)
    curl.setopt(pycurl.TCP_KEEPALIVE, 1)
    curl.setopt(pycurl.PROXY, endpoint.proxy)  # explicit: curl reads no environment itself
    curl.setopt(pycurl.NOPROXY, endpoint.no_proxy)
    curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    _set_tls(curl, endpoint.tls)
    return curl


def _set_tls(curl: pycurl.Curl, tls: TlsSettings) -> None:
    if tls.ca_file:
        curl.setopt(pycurl.CAINFO, tls.ca_file)
    else:
        # The system's trust store, as Python's ssl finds it (SSL_CERT_FILE and
        # SSL_CERT_DIR included), not the path the wheel's libcurl was built with.
        paths = ssl.get_default_verify_paths()
        if paths.cafile:
            curl.setopt(pycurl.CAINFO, paths.cafile)
        if paths.capath:
            curl.setopt(pycurl.CAPATH, paths.capath)
    if tls.cert_file:
        curl.setopt(pycurl.SSLCERT, tls.cert_file)
        curl.setopt(pycurl.SSLKEY, tls.key_file or tls.cert_file)


def request_headers(headers: Mapping[str, str]) -> list[str]:
    """curl's header list for a request: ours, and none that curl would add on its own."""
    lines = [f"{name}: {value}" for name, value in headers.items()]
    if not any(name.lower() == "content-type" for name in headers):
        lines.append(_NO_CONTENT_TYPE)
    lines.extend(_SUPPRESSED)
    return lines


class HttpClient:
    """Every HTTP request of the service: on the engine loop's thread only."""

    def __init__(self, loop: Loop, max_connections: int) -> None:
        self._loop = loop
        self._multi = pycurl.CurlMulti()
        # Idle keep-alive connections kept for reuse: one per delivery that may
        # be in flight, so a burst never closes what the next burst needs.
        self._multi.setopt(pycurl.M_MAXCONNECTS, max(1, max_connections))
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._timer: Timer | None = None
        self._idle: dict[Endpoint, list[_Transfer]] = {}
        self._busy: dict[int, _Transfer] = {}  # id(curl handle) -> transfer
        self._closed = False

    def post(
        self, endpoint: Endpoint, headers: list[str], body: bytes, timeout: float, bounds: BodyLimit
    ) -> Future[Response]:
        future: Future[Response] = self._loop.create_future()
        if self._closed:
            future.resolve(Response(-1, error="HTTP client closed"))
            return future
        idle = self._idle.get(endpoint)
        transfer = idle.pop() if idle else _Transfer(endpoint)
        transfer.prepare(body, headers, timeout, bounds)
        transfer.future = future
        try:
            self._multi.add_handle(transfer.curl)
        except pycurl.error as e:
            transfer.future = None
            future.resolve(Response(-1, error=f"curl refused the request: {e}"))
            return future
        self._busy[id(transfer.curl)] = transfer
        return future

    @property
    def in_flight(self) -> int:
        return len(self._busy)

    def close(self) -> None:
        """Drop every transfer and connection (the loop is stopping)."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for transfer in self._busy.values():
            self._multi.remove_handle(transfer.curl)
            transfer.curl.close()
        self._busy.clear()
        for transfers in self._idle.values():
            for transfer in transfers:
                transfer.curl.close()
        self._idle.clear()
        self._multi.close()

    # ----------------------------------------------------------------- curl's callbacks

    def _on_socket(self, what: int, fd: int, _multi: object, _data: object) -> None:
        if what == pycurl.POLL_REMOVE:
            self._loop.unwatch(fd)
            return
        mask = (READABLE if what & pycurl.POLL_IN else 0) | (
            WRITABLE if what & pycurl.POLL_OUT else 0
        )
        self._loop.watch(fd, mask, self._on_ready)

    def _on_timer(self, ms: int) -> None:
        # Called from inside curl: only schedule, never drive curl from here.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ms >= 0:
            self._timer = self._loop.call_later(ms / 1000.0, self._on_timeout)

    def _on_timeout(self) -> None:
        self._timer = None
        if not self._closed:
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
            self._collect()

    def _on_ready(self, fd: int, events: int) -> None:
        if self._closed:
            return
        flags = 0
        if events & READABLE:
            flags |= pycurl.CSELECT_IN
        if events & WRITABLE:
            flags |= pycurl.CSELECT_OUT
        if events & FAILED:
            flags |= pycurl.CSELECT_ERR
        self._multi.socket_action(fd, flags)
        self._collect()

    def _collect(self) -> None:
        multi = self._multi
        while True:
            queued, succeeded, failed = multi.info_read()
            for curl in succeeded:
                self._finish(curl, 0, "")
            for curl, code, message in failed:
                self._finish(curl, code, message)
            if not queued:
                return

    def _finish(self, curl: pycurl.Curl, code: int, message: str) -> None:
        self._multi.remove_handle(curl)
        transfer = self._busy.pop(id(curl))
        future, transfer.future = transfer.future, None
        response = transfer.response(code, message)
        transfer.body.clear()
        self._idle.setdefault(transfer.endpoint, []).append(transfer)
        if future is not None:
            future.resolve(response)
