"""The lean HTTP/1.1 client against scripted raw-socket servers: every framing it reads,
connection reuse, and every way a response can go wrong."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from dispatcher.config import TlsSettings
from dispatcher.http11 import Connections, HttpError, Origin, Response, request
from tests.support.node import make_tls_material

Script = Callable[[socket.socket, bytes], bool]  # (connection, request) -> keep going?


class RawServer:
    """Accepts connections; for each request read, runs ``script``; counts connections."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[bytes] = []
        self.connections = 0
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def origin(self) -> Origin:
        return Origin.parse(f"http://127.0.0.1:{self.port}/events?x=1")

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(data) < length:
                    data += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + data[:length])
                data = data[length:]
                if not self.script(conn, self.requests[-1]):
                    return

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def serve() -> Iterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script) -> RawServer:
        server = RawServer(script)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def answer(raw: bytes, keep: bool = True) -> Script:
    def script(conn: socket.socket, _request: bytes) -> bool:
        conn.sendall(raw)
        return keep

    return script


def post(
    server: RawServer,
    client: Connections | None = None,
    timeout: float = 2.0,
    limit: int = 1_000_000,
    error_limit: int | None = None,
) -> Response:
    client = client or Connections(None)
    raw = request(server.origin, [("ce-id", "1")], b"{}")
    return client.post(server.origin, raw, timeout, limit, error_limit)


def test_request_line_host_and_headers(serve) -> None:
    server = serve(answer(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n"))
    response = post(server)
    assert (response.status, response.body, response.truncated) == (202, b"", False)
    request = server.requests[0]
    assert request.startswith(b"POST /events?x=1 HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in request
    assert b"Content-Length: 2\r\n" in request and b"ce-id: 1\r\n" in request
    assert request.endswith(b"\r\n\r\n{}")


def test_keep_alive_reuses_one_connection(serve) -> None:
    server = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello"))
    client = Connections(None)
    for _ in range(5):
        response = post(server, client)
        assert (response.status, response.body, response.headers["x-a"]) == (200, b"hello", "b")
    assert server.connections == 1


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
    ],
)
def test_a_connection_the_server_closes_is_not_reused(serve, raw: bytes) -> None:
    server = serve(answer(raw, keep=False))
    client = Connections(None)
    assert post(server, client).body == b"ok"
    assert post(server, client).body == b"ok"
    assert server.connections == 2


def test_an_idle_connection_closed_by_the_server_is_replaced_not_failed(serve) -> None:
    # The server answers keep-alive, then closes the idle connection anyway
    # (as servers do on their keep-alive timeout): the next request must not fail.
    server = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", keep=False))
    now = [100.0]
    client = Connections(None, clock=lambda: now[0])
    post(server, client)
    idle = client._idle[server.origin][0]
    for _ in range(200):  # bounded wait for the server's FIN to arrive
        if not idle.quiet():
            break
        threading.Event().wait(0.005)
    now[0] += 1.0  # idle for a second: long enough to be checked before reuse
    assert post(server, client).status == 200
    assert server.connections == 2


def test_chunked_body_with_trailers_then_reuse(serve) -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    )
    server = serve(answer(raw))
    client = Connections(None)
    assert post(server, client).body == b"hello world"
    assert post(server, client).body == b"hello world"
    assert server.connections == 1


def test_body_until_close_without_length(serve) -> None:
    server = serve(answer(b"HTTP/1.1 200 OK\r\n\r\nall of it", keep=False))
    assert post(server).body == b"all of it"


def test_interim_1xx_responses_are_skipped(serve) -> None:
    raw = (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"
    )
    assert post(serve(answer(raw))).status == 201


def test_long_bodies_are_truncated_at_the_limit_for_the_status(serve) -> None:
    ok = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100))
    response = post(ok, limit=10, error_limit=3)
    assert (response.body, response.truncated) == (b"x" * 10, True)
    bad = serve(answer(b"HTTP/1.1 500 Oops\r\nContent-Length: 100\r\n\r\n" + b"e" * 100))
    response = post(bad, limit=10, error_limit=3)
    assert (response.status, response.body, response.truncated) == (500, b"eee", True)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "malformed response header"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "malformed content-length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", "in the middle of the body"),
        (b"", "closed the connection without a response"),
    ],
)
def test_broken_responses_are_errors_not_crashes(serve, raw: bytes, reason: str) -> None:
    server = serve(answer(raw, keep=False))
    with pytest.raises(HttpError, match=reason) as error:
        post(server)
    assert not error.value.timeout


def test_a_silent_server_times_out_within_the_budget(serve) -> None:
    server = serve(lambda _conn, _request: threading.Event().wait(5) and False)
    started = time.monotonic()
    with pytest.raises(HttpError) as error:
        post(server, timeout=0.2)
    assert error.value.timeout
    assert time.monotonic() - started < 1.0


def test_a_tls_handshake_that_never_answers_times_out_within_the_budget(tmp_path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepted by the kernel, then silence: no ServerHello ever
    ca = make_tls_material(tmp_path) / "ca.pem"
    origin = Origin.parse(f"https://127.0.0.1:{listener.getsockname()[1]}/")
    started = time.monotonic()
    try:
        with pytest.raises(HttpError, match="TLS handshake timed out") as error:
            Connections(TlsSettings(ca_file=str(ca)).context()).post(
                origin, request(origin, [], b""), 0.3, 100
            )
    finally:
        listener.close()
    assert error.value.timeout
    assert time.monotonic() - started < 1.5


def test_refused_connection(serve) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    origin = Origin.parse(f"http://127.0.0.1:{port}/")
    with pytest.raises(HttpError, match="connect failed") as error:
        Connections(None).post(origin, request(origin, [], b""), 1.0, 100)
    assert not error.value.timeout


def test_a_header_cannot_smuggle_another(serve) -> None:
    server = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    with pytest.raises(HttpError, match="line break"):
        request(server.origin, [("ce-x", "a\r\nEvil: 1")], b"")
    assert server.requests == []


@pytest.mark.parametrize(
    ("url", "host_header", "target"),
    [
        ("http://example.com", b"example.com", b"/"),
        ("http://example.com:8080/a/b?c=d", b"example.com:8080", b"/a/b?c=d"),
        ("https://example.com:443/x", b"example.com", b"/x"),
        ("http://[::1]:9000/", b"[::1]:9000", b"/"),
    ],
)
def test_origin_parsing(url: str, host_header: bytes, target: bytes) -> None:
    origin = Origin.parse(url)
    assert (origin.host_header, origin.target) == (host_header, target)


def test_not_http_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="not an http"):
        Origin.parse("ftp://example.com/")


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n",  # a superscript two is a "digit"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
    ],
)
def test_numbers_in_framing_are_plain_digits(serve, raw: bytes) -> None:
    with pytest.raises(HttpError, match="malformed"):
        post(serve(answer(raw, keep=False)))


def test_a_huge_chunk_is_not_buffered_past_the_limit(serve) -> None:
    def script(conn: socket.socket, _request: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n40000000\r\n")
        try:
            for _ in range(64):  # 4 MiB of a declared 1 GiB chunk, then silence
                conn.sendall(b"e" * 65536)
        except OSError:
            return False  # the client stopped reading at its limit and closed: expected
        threading.Event().wait(5)
        return False

    response = post(serve(script), limit=1_000_000, error_limit=100, timeout=3.0)
    assert (response.status, response.body, response.truncated) == (500, b"e" * 100, True)


def test_sending_a_large_body_to_a_slow_reader_stays_within_the_budget() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    accepted: list[socket.socket] = []

    def trickle() -> None:
        conn, _ = listener.accept()
        accepted.append(conn)
        while True:  # reads a little, often enough that no single send times out
            try:
                if not conn.recv(1024):
                    return
            except OSError:
                return
            threading.Event().wait(0.05)

    threading.Thread(target=trickle, daemon=True).start()
    origin = Origin.parse(f"http://127.0.0.1:{listener.getsockname()[1]}/")
    started = time.monotonic()
    try:
        with pytest.raises(HttpError) as error:
            Connections(None).post(origin, request(origin, [], b"x" * (8 * 1024 * 1024)), 1.0, 100)
        elapsed = time.monotonic() - started
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
    assert error.value.timeout
    assert elapsed < 2.0


def test_endless_trailers_are_an_error_not_a_buffer(serve) -> None:
    def script(conn: socket.socket, _request: bytes) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
        try:
            for _ in range(2000):  # trailer lines, never the empty line that ends them
                conn.sendall(b"X-T: " + b"t" * 60 + b"\r\n")
        except OSError:
            return False
        threading.Event().wait(5)
        return False

    with pytest.raises(HttpError, match="trailers larger"):
        post(serve(script), timeout=3.0)
