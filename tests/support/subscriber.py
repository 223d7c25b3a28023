"""A real HTTP subscriber in the test process, with programmable behaviour."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes
    at: float
    method: str = "POST"
    version: str = "HTTP/1.1"  # the request line's


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0  # seconds before answering
    hang: bool = False  # never answer (until the server stops)


Behaviour = Callable[[Received, int], Reply]


def _fields(lines: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header names lower-cased; a repeated one joined with ", " as HTTP reads it,
    so that a test sees a header that was sent twice."""
    fields: dict[str, str] = {}
    for name, value in lines:
        key = name.lower()
        fields[key] = f"{fields[key]}, {value}" if key in fields else value
    return fields  # (request, 0-based index) -> reply


class Subscriber:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour: Behaviour = behaviour or (lambda _r, _i: Reply(200))
        self.requests: list[Received] = []
        self.concurrent = 0
        self.max_concurrent = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"subscriber got {len(self.requests)} requests, expected {count} "
                        f"within {timeout}s"
                    )
                self._cond.wait(left)
            return list(self.requests)

    def ids(self) -> list[str]:
        with self._cond:
            return [r.headers.get("ce-id", "") for r in self.requests]

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real subscribers do

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                body = self.rfile.read(length)
                received = Received(
                    self.path,
                    _fields(self.headers.items()),
                    body,
                    time.monotonic(),
                    self.command,
                    self.request_version,
                )
                with owner._cond:
                    index = len(owner.requests)
                    owner.requests.append(received)
                    owner.concurrent += 1
                    owner.max_concurrent = max(owner.max_concurrent, owner.concurrent)
                    owner._cond.notify_all()
                try:
                    reply = owner.behaviour(received, index)
                    if reply.hang:
                        owner._stop.wait()
                        return
                    if reply.delay:
                        owner._stop.wait(reply.delay)
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                finally:
                    with owner._cond:
                        owner.concurrent -= 1

            # Any other method is recorded too (a test can tell it was used) and refused.
            def _other(self) -> None:
                received = Received(
                    self.path,
                    _fields(self.headers.items()),
                    b"",
                    time.monotonic(),
                    self.command,
                    self.request_version,
                )
                with owner._cond:
                    owner.requests.append(received)
                    owner._cond.notify_all()
                self.send_response(405)
                self.send_header("allow", "POST")
                self.send_header("content-length", "0")
                self.end_headers()

            do_GET = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _other

        return Handler
