"""HTTP requests through libcurl's multi interface, driven by the engine loop.

libcurl does every part of HTTP (framing, chunked bodies, keep-alive, TLS,
proxies, Basic auth from ``user:password@``); this module only feeds it
requests and turns finished transfers into ``Response`` values. One
``CurlMulti`` serves every binding: curl tells the loop which sockets to
watch (``M_SOCKETFUNCTION``), and after each call we ask it when to wake it
next (``timeout()``, rather than a timer callback from inside curl: every
callback would re-enter the interpreter from inside curl), so thousands
of requests can be in flight on the one engine thread.

What each request costs in Python is kept to a handful of calls: easy
handles are pooled per endpoint with everything that does not change set
once (URL, TLS files, proxy, HTTP/1.1, no redirects); a request sets only its
body, its header list and its timeout. Response headers are collected only
when the caller reads them (a reply may be in them): each header line is a
callback from curl, and each callback must take the GIL back from the pika
thread. ``Retry-After`` comes from curl itself (``CURLINFO_RETRY_AFTER``,
delta-seconds or an HTTP date), collected or not.

Bodies are bounded: at most ``keep`` bytes of a response are kept, and a
body longer than ``limit`` ends the transfer there (curl stops reading; the
connection is closed). The answer is still the status the server sent, with
``truncated`` set: a 2xx with an oversized body is a delivery.

Every failure is a value: ``Response.status is None`` with ``error`` saying
what happened (``timeout`` when the attempt's budget ran out). Nothing here
raises into the delivery code.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import pycurl

from dispatcher.config import TlsSettings
from dispatcher.config.redaction import redact_text
from dispatcher.delivery.seams import Response
from dispatcher.http.endpoint import Endpoint
from dispatcher.loop import FAILED, READABLE, WRITABLE, Future, Loop, Timer

USER_AGENT: Final = "dispatcher"
# curl adds these unless told not to: a form content type on every POST
# without one, and "Expect: 100-continue" (a round trip) for large bodies.
_SUPPRESSED: Final = ("Expect:",)
_NO_CONTENT_TYPE: Final = "Content-Type:"


@dataclass(frozen=True, slots=True)
class Reading:
    """What to keep of a response: ``keep`` bytes of the body (``limit``: read at
    most this many, then stop the transfer), and its headers or not."""

    keep: int
    limit: int
    headers: bool = False


class _Transfer:
    """One easy handle, reused for request after request to one endpoint."""

    __slots__ = (
        "aborted",
        "body",
        "curl",
        "future",
        "head",
        "idle",
        "keep",
        "kept",
        "limit",
        "listening",
        "multi",
        "received",
        "truncated",
    )

    def __init__(self, endpoint: Endpoint, multi: _Multi, idle: list[_Transfer]) -> None:
        self.multi = multi
        self.idle = idle  # its endpoint's handles waiting for a request
        self.head: list[bytes] = []
        self.body: list[bytes] = []
        self.kept = self.received = self.keep = self.limit = 0
        self.truncated = self.aborted = self.listening = False
        self.future: Future[Response] | None = None
        self.curl = _easy_handle(endpoint)
        self.curl.setopt(pycurl.WRITEFUNCTION, self._write)

    def prepare(self, body: bytes, headers: list[str], timeout: float, reading: Reading) -> None:
        self.head.clear()
        self.body.clear()
        self.kept = self.received = 0
        self.keep, self.limit = reading.keep, reading.limit
        self.truncated = self.aborted = False
        curl = self.curl
        if reading.headers != self.listening:
            # list.append: a C call per header line, only when someone reads them.
            if reading.headers:
                curl.setopt(pycurl.HEADERFUNCTION, self.head.append)
            else:
                curl.unsetopt(pycurl.HEADERFUNCTION)
            self.listening = reading.headers
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

    def finish(self, response: Response) -> None:
        """Answer the request and wait, idle, for the next one to this endpoint."""
        future, self.future = self.future, None
        self.body.clear()
        self.idle.append(self)
        if future is not None:
            future.resolve(response)

    def response(self, code: int, message: str) -> Response:
        status = int(self.curl.getinfo(pycurl.RESPONSE_CODE))
        body = b"".join(self.body) if self.body else b""
        if code == 0 or (self.aborted and code == pycurl.E_WRITE_ERROR and status):
            head = list(self.head) if self.head else None
            response = Response(status, body, head, truncated=self.truncated)
            if not 200 <= status < 300:
                # 0: none, or one curl could not read (then ours is the only wait).
                response.retry_after = float(self.curl.getinfo(pycurl.RETRY_AFTER)) or None
            return response
        if code == pycurl.E_OPERATION_TIMEDOUT:
            return Response(None, error="timeout", timed_out=True)
        # curl quotes a URL it cannot use whole, proxy password included; the
        # text goes into log lines and dead letters.
        return Response(None, error=f"curl error {code}: {redact_text(message)}"[:300])


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
    """curl's header list for a request (names lower-case, as ``event.http.to_http`` writes
    them): ours, and none that curl would add on its own."""
    lines = [f"{name}: {value}" for name, value in headers.items()]
    if "content-type" not in headers:
        lines.append(_NO_CONTENT_TYPE)
    lines.extend(_SUPPRESSED)
    return lines


# libcurl looks for a reusable connection by scanning every connection its
# multi handle has to the destination, per request: with 2,000 deliveries in
# flight to one subscriber that scan was 15% of the engine's CPU. Each multi
# handle keeps its own connections, so transfers are spread over as many as
# keep each one's pool to this size.
CONNECTIONS_PER_MULTI: Final = 256


class HttpClient:
    """Every HTTP request of the service: on the engine loop's thread only."""

    def __init__(self, loop: Loop, max_connections: int) -> None:
        self._loop = loop
        count = max(1, -(-max_connections // CONNECTIONS_PER_MULTI))
        # Idle keep-alive connections kept for reuse: one per delivery that may
        # be in flight, so a burst never closes what the next burst needs.
        per_multi = max(1, -(-max_connections // count))
        self._multis = [_Multi(loop, per_multi) for _ in range(count)]
        self._next_multi = 0
        self._idle: dict[Endpoint, list[_Transfer]] = {}
        self._closed = False

    def post(
        self, endpoint: Endpoint, headers: list[str], body: bytes, timeout: float, reading: Reading
    ) -> Future[Response]:
        future: Future[Response] = self._loop.create_future()
        if self._closed:
            future.resolve(Response(None, error="HTTP client closed"))
            return future
        idle = self._idle.get(endpoint)
        transfer = idle.pop() if idle else self._new_transfer(endpoint)
        transfer.prepare(body, headers, timeout, reading)
        transfer.future = future
        transfer.multi.add(transfer)
        return future

    def _new_transfer(self, endpoint: Endpoint) -> _Transfer:
        # A handle stays with one multi handle (and its connections) for life.
        multi = self._multis[self._next_multi]
        self._next_multi = (self._next_multi + 1) % len(self._multis)
        return _Transfer(endpoint, multi, self._idle.setdefault(endpoint, []))

    def close(self) -> None:
        """Drop every transfer and connection (the loop is stopping)."""
        self._closed = True
        for multi in self._multis:
            multi.close()
        for transfers in self._idle.values():
            for transfer in transfers:
                transfer.curl.close()
        self._idle.clear()


class _Multi:
    """One ``CurlMulti`` on the loop: its sockets, its next deadline, its transfers."""

    def __init__(self, loop: Loop, max_connections: int) -> None:
        self._loop = loop
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_MAXCONNECTS, max_connections)
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._timer: Timer | None = None
        self._kicked = False  # a socket_action(TIMEOUT) is due this iteration
        self.busy: dict[int, _Transfer] = {}  # id(curl handle) -> transfer
        self._closed = False

    def add(self, transfer: _Transfer) -> None:
        try:
            self._multi.add_handle(transfer.curl)
        except pycurl.error as e:
            transfer.finish(Response(None, error=f"curl refused the request: {e}"))
            return
        self.busy[id(transfer.curl)] = transfer
        if not self._kicked:
            # curl starts what was added on its next timeout action: one for all
            # the requests added in this pass of the loop.
            self._kicked = True
            self._loop.call_soon(self._kick)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        for transfer in self.busy.values():
            self._multi.remove_handle(transfer.curl)
            transfer.curl.close()
        self.busy.clear()
        self._multi.close()

    # ----------------------------------------------------------------- curl's callbacks

    def _on_socket(self, what: int, fd: int, _multi: object, _data: object) -> None:
        if what == pycurl.POLL_REMOVE:
            # Usually a kept-alive connection between two requests: let it rest
            # rather than unregister it now and register it again for the next.
            self._loop.rest(fd)
            return
        mask = (READABLE if what & pycurl.POLL_IN else 0) | (
            WRITABLE if what & pycurl.POLL_OUT else 0
        )
        self._loop.watch(fd, mask, self._on_ready)

    def _kick(self) -> None:
        """Start what ``add`` handed over. The timer, if one is armed, stays ours:
        dropping it here without cancelling it left it to fire (and re-arm) on its
        own, one more live timer per kick under a steady stream of requests."""
        self._kicked = False
        self._drive_timeout()

    def _on_timer(self) -> None:
        self._timer = None
        self._drive_timeout()

    def _drive_timeout(self) -> None:
        if not self._closed:
            self._multi.socket_action(pycurl.SOCKET_TIMEOUT, 0)
            self._collect()

    def _wake_for_curl(self) -> None:
        """After driving curl: be back when its next deadline (a timeout, a retry of
        a connect) is due. A timer already set for earlier stays; one set for later
        is replaced. A timer that fires early costs one harmless timeout action."""
        ms = self._multi.timeout()
        if ms < 0:
            return
        when = self._loop.time() + ms / 1000.0
        timer = self._timer
        if timer is not None and not timer.cancelled and timer.when <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timer = self._loop.call_later(ms / 1000.0, self._on_timer)

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
                self._done(curl, 0, "")
            for curl, code, message in failed:
                self._done(curl, code, message)
            if not queued:
                break
        self._wake_for_curl()

    def _done(self, curl: pycurl.Curl, code: int, message: str) -> None:
        self._multi.remove_handle(curl)
        transfer = self.busy.pop(id(curl))
        transfer.finish(transfer.response(code, message))
