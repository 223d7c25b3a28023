"""The operations listener: ``/metrics``, ``/healthz`` and ``/readyz`` on ``http.listen``.

Served by the standard library on a thread of its own, never by the engine
loop's (a stuck loop must still be reported). ``prometheus_client``'s
``start_http_server`` would answer every path with metrics, so the three
paths are routed here and anything else is a 404.

- ``/healthz``: 200 while the process and its broker I/O loop are alive. The
  engine loop (which runs the broker connections) ticks every second,
  connected or not; a tick older than ``STUCK_AFTER`` means the loop is stuck,
  and Kubernetes should restart the pod: 503.
- ``/readyz``: 200 only while every binding has a live consumer or is paused
  by its circuit breaker (``{"ready": true, "paused": [bindings...]}``);
  otherwise 503 with ``{"ready": false, "down": [bindings...]}``. 503 during
  shutdown.

Hostile clients (a port scan, a load balancer that half-opens connections, a
slow client sending a byte a second) must not cost a probe its answer, nor the
log its JSON. So connections are not a thread each: one thread (``ops-http``)
accepts every connection, reads what it sends and writes its answer, with a
selector and non-blocking sockets. Once a request's head has fully arrived,
``http.server`` parses and answers it from the bytes already read into
memory (a millisecond or so; ``/metrics`` a few, and one render serves every
request within ``METRICS_SHARED_FOR`` of it), and the answer goes out as
the client takes it, within ``WRITE_TIMEOUT``: a slow client never holds the
thread. A
connection that has not sent its head within ``HEAD_DEADLINE``, or sends more
than ``MAX_HEAD`` bytes without finishing it, is closed. The listener holds
at most ``connection_limit()`` connections, a share of the process's file
descriptors, so hostile clients never take the ones deliveries need; past it
the oldest still sending its head is closed to make room. A client that goes
away or sends junk is one debug line, never a traceback. The listen backlog
is large, so a burst of connects is accepted, not left to SYN retransmits.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler
from typing import Any, Final, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dispatcher.observe.logs import get_logger

log = get_logger()

T = TypeVar("T")

STUCK_AFTER = 10.0  # seconds without a broker-loop tick before /healthz says 503

# Connects the kernel queues while the accept loop is busy (capped by
# net.core.somaxconn, 4096 by default since Linux 5.4). The loop takes thousands
# a second, so a full queue drains well within a probe's one-second timeout; at
# 1,024 a burst at debug level overflowed now and then (a SYN dropped, then
# retransmitted a second later).
BACKLOG: Final = 4096
MAX_CONNECTIONS: Final = 2048  # open at once, if the descriptor limit allows
# The listener's share of the descriptor limit: the rest is for libcurl's
# connections to subscribers, the broker, Redis and the log.
DESCRIPTOR_SHARE: Final = 4
HEAD_DEADLINE: Final = 5.0  # seconds for a client to send its whole request head
MAX_HEAD: Final = 8 * 1024  # bytes: the request line and headers of a GET
WRITE_TIMEOUT: Final = 2.0  # seconds a client has to take its whole answer
# A /metrics answer is shared by the requests that follow it this closely: a
# flood of scrapes, or thousands of clients that never read, costs at most ten
# renders a second and holds as many bodies, not one each (with 40 bindings a
# render is 117 KB and 7.5 ms of CPU under the GIL the deliveries need).
METRICS_SHARED_FOR: Final = 0.1
# The empty line that ends a head: http.server takes bare LF line ends too (a
# hand-typed ``printf 'GET /healthz HTTP/1.0\n\n' | nc``), so both count.
_ENDS_OF_HEAD: Final = (b"\n\r\n", b"\n\n")
_TICK: Final = 0.5  # the accept loop's check of deadlines and of close()
_PAUSE: Final = 0.1  # seconds without accepting when no descriptor can be had
# accept(2) on Linux passes on errors of the connection it took (the client
# reset it, say): that connection is gone, the next one may be fine.
_CONNECTION_ERRORS: Final = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        errno.EPERM,
    }
)
# Out of descriptors or kernel memory: room may be made, or come back shortly.
_OUT_OF_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_limit() -> int:
    """How many connections the listener holds at once: ``MAX_CONNECTIONS``, or a
    ``DESCRIPTOR_SHARE`` of the soft descriptor limit if that is less.

    The service raises its soft limit to the hard one, but a hard limit can be
    low too (``--ulimit nofile=1024:1024``). With more held connections than
    the limit allows, slow clients would take the descriptors deliveries need,
    and every accept would fail with EMFILE, leaving a probe's connect in the
    backlog behind theirs.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft // DESCRIPTOR_SHARE))


def _listener(host: str, port: int) -> socket.socket:
    """The listening socket: IPv6 for an IPv6 address (``[::]`` also takes IPv4
    where the system can, as a dual-stack pod needs), else IPv4."""
    if ":" not in host:
        return socket.create_server((host, port), backlog=BACKLOG)
    dual = host == "::" and socket.has_dualstack_ipv6()
    return socket.create_server(
        (host, port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=dual
    )


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        last_tick: Callable[[], float],
        consumers: Callable[[], Mapping[str, str]],
        stopping: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._last_tick = last_tick
        self._consumers = consumers
        self._stopping = stopping
        self._clock = clock
        self._listener = _listener(host, port)
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        # Each connection still sending its head: when it opened, what it sent so
        # far (insertion order: oldest first).
        self._waiting: dict[socket.socket, tuple[float, bytearray]] = {}
        # Each connection being answered: by when it must have taken the rest, and
        # the rest (its head, then a body that may be shared with other answers).
        self._answering: dict[socket.socket, tuple[float, list[memoryview]]] = {}
        self._metrics: tuple[float, bytes] | None = None  # the last render, and when
        self._limit = MAX_CONNECTIONS  # start() sets it from the limit then in force
        self._resume_at: float | None = None  # while accepting is paused
        self._stalled = False  # paused, and not one connection accepted since
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="ops-http", daemon=True)
        self._handler = self._handler_class()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        # Read here, not at construction: the service raises its soft limit on open
        # files just before it starts the listener.
        self._limit = connection_limit()
        self._thread.start()
        log.info(
            "listening",
            port=self.port,
            paths=["/metrics", "/healthz", "/readyz"],
            max_connections=self._limit,
        )

    def close(self) -> None:
        """Stop accepting and answering; bounded, whether or not ``start`` ran."""
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join(2 * _TICK)
        for sock in [*self._waiting, *self._answering]:
            self._drop(sock, None)
        with contextlib.suppress(OSError, KeyError, ValueError):  # paused, say
            self._selector.unregister(self._listener)
        self._selector.close()
        self._listener.close()

    # ----------------------------------------------------------------- answers

    def metrics(self) -> bytes:
        """The registry in Prometheus' text format: rendered now, or the render of a
        request less than ``METRICS_SHARED_FOR`` ago (the same bytes, not a copy)."""
        now = self._clock()
        last = self._metrics
        if last is not None and 0 <= now - last[0] < METRICS_SHARED_FOR:
            return last[1]
        body = generate_latest(self._registry)
        self._metrics = (now, body)
        return body

    def healthz(self) -> tuple[int, dict[str, object]]:
        age = self._clock() - self._last_tick()
        if age > STUCK_AFTER:
            return 503, {"alive": False, "broker_loop_stalled_s": round(age, 1)}
        return 200, {"alive": True}

    def readyz(self) -> tuple[int, dict[str, object]]:
        if self._stopping():
            return 503, {"ready": False, "reason": "shutting down"}
        consumers = self._consumers()
        down = sorted(name for name, state in consumers.items() if state == "down")
        if down:
            return 503, {"ready": False, "down": down}
        # A binding its circuit breaker paused is not a broken process: restarting
        # it would not bring the subscriber back.
        paused = sorted(name for name, state in consumers.items() if state == "paused")
        return 200, {"ready": True, "paused": paused} if paused else {"ready": True}

    # ----------------------------------------------------------------- the accept loop

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            timeout = _TICK if self._resume_at is None else _PAUSE
            for key, events in self._selector.select(timeout):
                if key.fileobj is self._listener:
                    self._accept()
                elif events & selectors.EVENT_WRITE:
                    self._write(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._check(key.fileobj)  # type: ignore[arg-type]
            self._expire()
            self._resume()

    def _accept(self) -> None:
        while True:
            try:
                sock, _address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _CONNECTION_ERRORS:
                    continue
                # Out of descriptors: taken by another part of the process, as the
                # listener stays under its own limit. Make room from the oldest
                # client still sending its head; failing that, or on an error we do
                # not know, stop accepting for a moment: the listener stays
                # readable, and taking it up again at once would spin.
                if e.errno in _OUT_OF_RESOURCES and self._waiting:
                    self._drop(next(iter(self._waiting)), f"no descriptor: {e.strerror}")
                    continue
                self._pause(f"could not accept: {e.strerror}")
                return
            self._admit(sock)
            if self._resume_at is not None:
                return

    def _admit(self, sock: socket.socket) -> None:
        """Watch a new connection for its head, within the limit on held connections.

        Past the limit the oldest client still sending its head is closed: every
        real client (a kubelet, Prometheus) sends its head at once, so the oldest
        is the likeliest slow one, and a probe, always the newest, gets in. When
        all held connections have sent a whole request and are taking their
        answers, accepting pauses instead: new connects wait in the kernel's
        backlog, to be taken in order, not closed unanswered.
        """
        self._stalled = False
        sock.setblocking(False)
        self._waiting[sock] = (self._clock(), bytearray())
        self._selector.register(sock, selectors.EVENT_READ)
        # Connections taking their answers hold a descriptor too.
        if len(self._waiting) + len(self._answering) <= self._limit:
            return
        oldest = next(iter(self._waiting))
        if oldest is not sock:
            self._drop(oldest, "too many open connections")
        else:
            self._pause("too many requests waiting for an answer")

    def _pause(self, why: str) -> None:
        """Stop taking connects for ``_PAUSE`` seconds. One debug line until a
        connection is accepted again, not one per retry while descriptors run out."""
        if self._resume_at is None:
            self._selector.unregister(self._listener)
        if not self._stalled:
            self._stalled = True
            log.debug("ops listener paused", reason=why)
        self._resume_at = self._clock() + _PAUSE

    def _resume(self) -> None:
        if self._resume_at is not None and self._clock() >= self._resume_at:
            self._resume_at = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    def _check(self, sock: socket.socket) -> None:
        """Bytes arrived: keep them; hand the request over once its head is complete."""
        if sock not in self._waiting:
            return  # closed earlier in this round (to make room): its line is written
        data = self._io(sock, lambda: sock.recv(MAX_HEAD))
        if data is None:
            return
        head = self._waiting[sock][1]
        head += data
        if not data:
            self._drop(sock, "closed before a whole request")
        elif any(end in head for end in _ENDS_OF_HEAD):
            del self._waiting[sock]
            self._answer(sock, bytes(head))
        elif len(head) > MAX_HEAD:
            self._drop(sock, "request head too large")

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        """Parse and answer ``head`` into memory, then send it as the client takes it."""
        out = io.BytesIO()
        try:
            handled = self._handler((sock, head, out), None, self)
        except Exception as e:  # a request http.server cannot make sense of: one line
            self._drop(sock, f"{type(e).__name__}: {e}")
            return
        # The body apart from the head: a shared /metrics render is never copied.
        parts = [memoryview(out.getvalue()), memoryview(handled.body)]
        self._answering[sock] = (self._clock() + WRITE_TIMEOUT, parts)
        self._selector.modify(sock, selectors.EVENT_WRITE)
        self._write(sock)

    def _write(self, sock: socket.socket) -> None:
        deadline, rest = self._answering[sock]
        sent = self._io(sock, lambda: sock.sendmsg(rest))
        if sent is None:
            return
        rest = unsent(rest, sent)
        if rest:
            self._answering[sock] = (deadline, rest)
        else:
            self._drop(sock, None)  # answered: HTTP/1.0, one request per connection

    def _io(self, sock: socket.socket, call: Callable[[], T]) -> T | None:
        """``call()`` on the non-blocking ``sock``: None when it would block (try on
        the next readiness) or failed (the client is dropped)."""
        try:
            return call()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            self._drop(sock, type(e).__name__)
            return None

    def _expire(self) -> None:
        now = self._clock()
        for sock, (deadline, _rest) in list(self._answering.items()):
            if deadline <= now:
                self._drop(sock, "answer not taken within the deadline")
        deadline = now - HEAD_DEADLINE
        for sock, (opened, _head) in list(self._waiting.items()):
            if opened > deadline:
                return  # the rest are younger
            self._drop(sock, "no request within the deadline")

    def _drop(self, sock: socket.socket, why: str | None) -> None:
        self._waiting.pop(sock, None)
        self._answering.pop(sock, None)
        with contextlib.suppress(OSError, KeyError, ValueError):  # not registered
            self._selector.unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()
        if why is not None:
            log.debug("ops client dropped", reason=why)

    def _handler_class(self) -> Any:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            """``http.server``'s parsing and answering, fed the head already read."""

            server_version = "dispatcher"
            sys_version = ""
            body = b""  # sent after what is written to ``wfile``

            def setup(self) -> None:
                self.connection, head, self.wfile = self.request
                self.rfile = io.BytesIO(head)

            def finish(self) -> None:
                pass  # the answer is in memory: ``_write`` sends it

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the delivery log

            def log_error(self, format: str, *args: object) -> None:
                log.debug("ops client sent a bad request", detail=format % args)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, owner.metrics(), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    status, body = owner.healthz() if path == "/healthz" else owner.readyz()
                    self._send(status, json.dumps(body).encode(), "application/json")
                else:
                    self._send(404, b'{"error": "not found"}', "application/json")

            def do_HEAD(self) -> None:
                """What GET would answer, without the body (``curl -I``)."""
                self.do_GET()
                self.body = b""

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.body = body

        return Handler


def unsent(parts: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of ``parts`` once their first ``sent`` bytes went out."""
    for index, part in enumerate(parts):
        if sent < len(part):
            return [part[sent:], *parts[index + 1 :]]
        sent -= len(part)
    return []
