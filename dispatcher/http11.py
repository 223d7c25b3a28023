"""A lean HTTP/1.1 client for one thing: POST a small request, read the answer, keep the
connection for the next one.

Why not httpx or httpcore: with one worker thread per in-flight delivery, the
HTTP layer is most of the service's CPU. Profiles of ``make bench`` put h11
(httpcore's parser) at more than half of all GIL-holding samples; httpcore
spends about 385 us of CPU per request to a local subscriber and httpx about
594 us. A delivery needs a tiny part of HTTP: one request line, a handful of
headers, a body of known length; a status, headers and a bounded body back.
This module does exactly that on plain blocking sockets (TLS through
``ssl``), and nothing else: no redirects, no proxies from the environment, no
cookies, no HTTP/2.

Each worker thread keeps its own idle connections (``Connections``); a
connection is reused only when the previous response was read completely
and neither side asked to close it, and only when it is still quiet (a
readable idle socket means the peer closed it or sent garbage). A request
is never sent twice here: a failed attempt is the caller's to retry.

Errors are ``HttpError`` (with ``timeout`` set when a deadline passed); the
caller turns them into a failed attempt.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

_CRLF: Final = b"\r\n"
_HEAD_END: Final = b"\r\n\r\n"
_MAX_HEAD: Final = 64 * 1024  # status line and headers of a response, at most
_RECV: Final = 65536
_NO_BODY_STATUSES: Final = frozenset({204, 304})
_FORBIDDEN_IN_HEADERS: Final = ("\r", "\n", "\0")


class HttpError(Exception):
    """The attempt failed before a complete response: connect, send, receive or parse."""

    def __init__(self, reason: str, timeout: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.timeout = timeout


@dataclass(frozen=True, slots=True)
class Origin:
    """Where requests for one URL go, and the parts of every request line to it."""

    scheme: str
    host: str
    port: int
    target: bytes  # path and query, as sent in the request line
    host_header: bytes

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == default else f"{shown}:{port}"
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        return cls(parts.scheme, host, port, target.encode("ascii"), host_header.encode("idna"))


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes
    truncated: bool  # the body was longer than the limit; only the first part is kept


class _Connection:
    """One socket. Plain TCP runs in blocking mode with kernel send/receive timeouts
    (``SO_SNDTIMEO``/``SO_RCVTIMEO``), set only when the budget changes: Python's
    own socket timeouts cost an ``ioctl`` and a ``poll`` around every send and
    receive, each a GIL release that 50 busy threads then fight over. TLS
    sockets keep Python's timeouts (a kernel timeout would surface mid-record)."""

    __slots__ = ("armed", "buffer", "origin", "poller", "sock", "tls")

    def __init__(self, sock: socket.socket, origin: Origin, tls: bool) -> None:
        self.sock = sock
        self.origin = origin
        self.tls = tls
        self.buffer = b""  # bytes received beyond the previous response (none, normally)
        self.armed = 0.0  # the kernel timeouts now set (plain TCP)
        # poll, not select: select fails on descriptors above 1023.
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)
        if not tls:
            sock.settimeout(None)

    def arm(self, remaining: float) -> None:
        """Let no single send or receive wait past ``remaining`` seconds (give or take 10%)."""
        if self.tls:
            self.sock.settimeout(remaining)
        elif not 0.9 * self.armed <= remaining <= self.armed:
            seconds = int(remaining)
            value = struct.pack("ll", seconds, int((remaining - seconds) * 1e6) or 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            self.armed = remaining

    def quiet(self) -> bool:
        """Still usable: nothing to read on an idle connection (EOF or stray bytes mean no)."""
        if self.buffer:
            return False
        try:
            return not self.poller.poll(0)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Connections:
    """Idle keep-alive connections of one thread, per origin; at most ``keep`` each."""

    def __init__(
        self,
        tls: ssl.SSLContext | None,
        keep: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._tls = tls
        self._keep = keep
        self._clock = clock
        self._idle: dict[Origin, list[_Connection]] = {}

    def post(
        self,
        origin: Origin,
        request: bytes,
        timeout: float,
        limit: int,
        error_limit: int | None = None,
    ) -> Response:
        """Send ``request`` (from ``request()``) and read the response; ``HttpError`` if it
        is not complete within ``timeout`` seconds, all of it (connect, send, every
        read) on one clock.

        A body longer than ``limit`` (``error_limit`` for a status that is not
        2xx) is cut there and marked truncated; the connection is then closed.
        """
        deadline = self._clock() + timeout
        connection = self._checkout(origin, deadline)
        try:
            self._send(connection, request, deadline)
            response, reusable = self._receive(connection, deadline, limit, error_limit)
        except BaseException:
            connection.close()
            raise
        if reusable:
            self._checkin(connection)
        else:
            connection.close()
        return response

    def close(self) -> None:
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    # ----------------------------------------------------------------- connections

    def _checkout(self, origin: Origin, deadline: float) -> _Connection:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.quiet():
                return connection
            connection.close()
        return self._connect(origin, deadline)

    def _checkin(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) < self._keep:
            idle.append(connection)
        else:
            connection.close()

    def _connect(self, origin: Origin, deadline: float) -> _Connection:
        remaining = self._remaining(deadline)
        try:
            sock = socket.create_connection((origin.host, origin.port), timeout=remaining)
        except TimeoutError:
            raise HttpError("connect timed out", timeout=True) from None
        except OSError as e:
            raise HttpError(f"connect failed: {_describe(e)}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if origin.scheme == "https":
                if self._tls is None:
                    raise HttpError("https URL without a TLS context")
                sock.settimeout(self._remaining(deadline))
                sock = self._tls.wrap_socket(sock, server_hostname=origin.host)
        except HttpError:
            sock.close()
            raise
        except TimeoutError:
            sock.close()
            raise HttpError("TLS handshake timed out", timeout=True) from None
        except (OSError, ssl.SSLError) as e:
            sock.close()
            raise HttpError(f"TLS handshake failed: {_describe(e)}") from None
        return _Connection(sock, origin, tls=origin.scheme == "https")

    def _remaining(self, deadline: float) -> float:
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise HttpError("timed out", timeout=True)
        return remaining

    # ----------------------------------------------------------------- I/O

    def _send(self, connection: _Connection, request: bytes, deadline: float) -> None:
        view = memoryview(request)
        try:
            while view:
                # One send at a time, re-armed from the deadline: sendall would give
                # every partial send a fresh timeout (a slow reader of a large body
                # could hold the attempt many times its budget).
                connection.arm(self._remaining(deadline))
                view = view[connection.sock.send(view) :]
        except (TimeoutError, BlockingIOError):
            raise HttpError("send timed out", timeout=True) from None
        except OSError as e:
            raise HttpError(f"send failed: {_describe(e)}") from None

    def _recv(self, connection: _Connection, deadline: float) -> bytes:
        try:
            connection.arm(self._remaining(deadline))
            return connection.sock.recv(_RECV)
        except (TimeoutError, BlockingIOError):
            raise HttpError("timed out waiting for the response", timeout=True) from None
        except OSError as e:
            raise HttpError(f"receive failed: {_describe(e)}") from None

    def _receive(
        self, connection: _Connection, deadline: float, limit: int, error_limit: int | None
    ) -> tuple[Response, bool]:
        while True:  # 1xx interim responses (103 Early Hints) come before the real one
            status, headers, keep_alive = self._read_head(connection, deadline)
            if status >= 200:
                break
        if error_limit is not None and not 200 <= status < 300:
            limit = error_limit
        if status in _NO_BODY_STATUSES:
            return Response(status, headers, b"", False), keep_alive
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body, truncated = self._read_chunked(connection, deadline, limit)
            return Response(status, headers, body, truncated), keep_alive and not truncated
        length = headers.get("content-length")
        if length is not None:
            body, truncated = self._read_length(connection, _length(length), deadline, limit)
            return Response(status, headers, body, truncated), keep_alive and not truncated
        body, truncated = self._read_to_close(connection, deadline, limit)
        return Response(status, headers, body, truncated), False

    def _read_head(
        self, connection: _Connection, deadline: float
    ) -> tuple[int, dict[str, str], bool]:
        data = connection.buffer
        while (end := data.find(_HEAD_END)) < 0:
            if len(data) > _MAX_HEAD:
                raise HttpError("response head larger than 64 KiB")
            chunk = self._recv(connection, deadline)
            if not chunk:
                raise HttpError("server closed the connection without a response")
            data += chunk
        connection.buffer = data[end + 4 :]
        lines = data[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
            raise HttpError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise HttpError(f"malformed response header: {line[:60]!r}")
            headers[name.strip().lower()] = value.strip()
        connection_header = headers.get("connection", "").lower()
        if version == "HTTP/1.0":
            keep_alive = "keep-alive" in connection_header
        else:
            keep_alive = "close" not in connection_header
        return int(code), headers, keep_alive

    def _read_length(
        self, connection: _Connection, length: int, deadline: float, limit: int
    ) -> tuple[bytes, bool]:
        wanted = min(length, limit + 1)  # one byte more than the limit says "truncated"
        data = connection.buffer
        while len(data) < wanted:
            chunk = self._recv(connection, deadline)
            if not chunk:
                raise HttpError("server closed the connection in the middle of the body")
            data += chunk
        if length > limit:
            connection.buffer = b""
            return data[:limit], True
        connection.buffer = data[length:]
        return data[:length], False

    def _read_to_close(
        self, connection: _Connection, deadline: float, limit: int
    ) -> tuple[bytes, bool]:
        data = connection.buffer
        while len(data) <= limit:
            chunk = self._recv(connection, deadline)
            if not chunk:
                return data, False
            data += chunk
        return data[:limit], True

    def _read_chunked(
        self, connection: _Connection, deadline: float, limit: int
    ) -> tuple[bytes, bool]:
        body: list[bytes] = []
        size = 0
        data = connection.buffer
        while True:
            while (end := data.find(_CRLF)) < 0:
                data = self._more(connection, data, deadline)
            chunk_size = _chunk_size(data[:end])
            data = data[end + 2 :]
            if chunk_size == 0:
                # Trailers (rare) end with an empty line, like the head.
                while not data.startswith(_CRLF) and (end := data.find(_HEAD_END)) < 0:
                    if len(data) > _MAX_HEAD:
                        raise HttpError("response trailers larger than 64 KiB")
                    data = self._more(connection, data, deadline)
                data = data[2:] if data.startswith(_CRLF) else data[end + 4 :]
                connection.buffer = data
                return b"".join(body), False
            pieces = [data]
            have = len(data)
            while have < chunk_size + 2:
                if size + have > limit:  # a huge chunk: never buffer past the limit
                    connection.buffer = b""
                    return (b"".join(body) + b"".join(pieces))[:limit], True
                piece = self._recv(connection, deadline)
                if not piece:
                    raise HttpError("server closed the connection in the middle of the body")
                pieces.append(piece)
                have += len(piece)
            data = b"".join(pieces)
            body.append(data[:chunk_size])
            size += chunk_size
            data = data[chunk_size + 2 :]
            if size > limit:
                connection.buffer = b""
                return b"".join(body)[:limit], True

    def _more(self, connection: _Connection, data: bytes, deadline: float) -> bytes:
        chunk = self._recv(connection, deadline)
        if not chunk:
            raise HttpError("server closed the connection in the middle of the body")
        if len(data) > _MAX_HEAD and _CRLF not in data:
            raise HttpError("malformed chunked body")
        return data + chunk


class ThreadConnections:
    """``Connections`` per worker thread (threads never share a socket), closed together."""

    def __init__(self, tls: ssl.SSLContext | None, keep: int = 2) -> None:
        self._tls = tls
        self._keep = keep
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Connections] = []

    def get(self) -> Connections:
        connections: Connections | None = getattr(self._local, "connections", None)
        if connections is None:
            connections = Connections(self._tls, self._keep)
            self._local.connections = connections
            with self._lock:
                self._all.append(connections)
        return connections

    def close(self) -> None:
        with self._lock:
            every, self._all = self._all, []
        for connections in every:
            connections.close()


def request(origin: Origin, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    """The bytes of a POST to ``origin``: built once, sent on every attempt."""
    lines = [
        f"POST {origin.target.decode('ascii')} HTTP/1.1",
        f"Host: {origin.host_header.decode('ascii')}",
        f"Content-Length: {len(body)}",
    ]
    for name, value in headers:
        # Attribute values are already checked for control characters; this is
        # the last line of defence against a header injecting another one.
        if any(c in name or c in value for c in _FORBIDDEN_IN_HEADERS):
            raise HttpError(f"header {name!r} contains a line break or NUL")
        lines.append(f"{name}: {value}")
    lines.append("\r\n")
    try:
        return "\r\n".join(lines).encode("latin-1") + body
    except UnicodeEncodeError as e:
        raise HttpError(f"a header is not Latin-1: {e}") from None


def _length(text: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise HttpError(f"malformed content-length {text[:40]!r}")
    return int(text)


def _chunk_size(line: bytes) -> int:
    text = line.split(b";", 1)[0].strip()
    # Hex digits only: int() would also take a sign, "0x" and underscores.
    if not text or len(text) > 16 or text.strip(b"0123456789abcdefABCDEF"):
        raise HttpError(f"malformed chunk size {text[:20]!r}")
    return int(text, 16)


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:200]
