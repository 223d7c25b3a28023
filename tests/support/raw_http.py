"""A raw-socket HTTP server that answers with exactly the bytes a test scripts.

For hostile-subscriber tests: a response no well-behaved HTTP library would
write (both Content-Length and Transfer-Encoding, a bad chunk, a 100 KB
header line, garbage, a body that drips or stops half-way). Each accepted
connection reads one request (head and Content-Length body) at a time and
plays the script for it; the server records every request and counts the
connections it accepted (keep-alive reuse shows as one).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# A step of a script: bytes to send, a float to sleep (seconds), or None to close.
Step = bytes | float | None
Script = Callable[[int], list[Step]]  # request index -> steps


@dataclass
class RawRequest:
    head: bytes
    body: bytes

    @property
    def request_line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def header(self, name: str) -> str | None:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.decode("latin-1").partition(":")
            if key.strip().lower() == name.lower():
                return value.strip()
        return None


@dataclass
class RawServer:
    script: Script
    tls: ssl.SSLContext | None = None
    requests: list[RawRequest] = field(default_factory=list)
    accepted: int = 0
    send_failed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def url(self, path: str = "/") -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            # close() alone does not wake a thread blocked in accept(): the port
            # would go on accepting. shutdown() does.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            buffer = b""
            while not self._closed.is_set():
                request, buffer = _read_request(conn, buffer)
                if request is None:
                    return
                index = len(self.requests)
                self.requests.append(request)
                if not self._play(conn, self.script(index)):
                    return
        except (OSError, ssl.SSLError):
            return
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _play(self, conn: socket.socket, steps: list[Step]) -> bool:
        for step in steps:
            if step is None:
                return False
            if isinstance(step, float):
                if self._closed.wait(step):
                    return False
                continue
            try:
                conn.sendall(step)
            except OSError:
                self.send_failed.set()
                return False
        return True


def _read_request(conn: socket.socket, buffer: bytes) -> tuple[RawRequest | None, bytes]:
    while b"\r\n\r\n" not in buffer:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        buffer += chunk
    head, _, rest = buffer.partition(b"\r\n\r\n")
    request = RawRequest(head, b"")
    length = int(request.header("content-length") or 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        rest += chunk
    request.body = rest[:length]
    return request, rest[length:]


def ok(status: int = 200, body: bytes = b"", extra: bytes = b"") -> list[Step]:
    """A well-formed keep-alive response."""
    head = f"HTTP/1.1 {status} X\r\ncontent-length: {len(body)}\r\n".encode()
    return [head + extra + b"\r\n" + body]


def drip(data: bytes, every: float) -> list[Step]:
    steps: list[Step] = []
    for byte in data:
        steps += [bytes([byte]), every]
    return steps
