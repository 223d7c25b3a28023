"""The libcurl client against raw-socket servers: hostile answers, bounds, what is sent.

Every hostile answer ends as a value, never an exception or a hang: a failed
attempt (``status is None``, which delivery retries and then dead-letters) or,
where RFC 9112 says how to read the message, that reading.
"""

from __future__ import annotations

import base64
import email.utils
import ssl
import time
from pathlib import Path

import pytest

from dispatcher.config import TlsSettings
from dispatcher.delivery.seams import Response
from dispatcher.delivery.waits import Waits
from dispatcher.errors import ConfigError
from dispatcher.http.client import HttpClient, Reading, request_headers
from dispatcher.http.endpoint import Endpoint, endpoint
from dispatcher.loop import Loop
from tests.support.node import make_tls_material
from tests.support.raw_http import RawServer, Step, drip, ok

BOUNDS = Reading(keep=4096, limit=64 * 1024, headers=True)


@pytest.fixture
def http():
    loop = Loop()
    client = HttpClient(loop, 10)

    def post(
        target: Endpoint | str,
        body: bytes = b"{}",
        headers: dict[str, str] | None = None,
        timeout: float = 2.0,
        reading: Reading = BOUNDS,
    ) -> Response:
        where = Endpoint(target) if isinstance(target, str) else target

        async def one() -> Response:
            # The header list as delivery builds it: ours plus curl's suppressions.
            return await client.post(where, request_headers(headers or {}), body, timeout, reading)

        return loop.run_until_complete(one())

    yield post
    client.close()
    loop.close()


@pytest.fixture
def serve():
    made: list[RawServer] = []

    def start(script, tls: ssl.SSLContext | None = None) -> RawServer:
        server = RawServer(script if callable(script) else (lambda _i: script), tls)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


# ----------------------------------------------------------------- hostile subscribers


def test_content_length_and_transfer_encoding_is_read_as_chunked(http, serve):
    """RFC 9112 6.3: Transfer-Encoding overrides Content-Length (the reading libcurl does)."""
    server = serve(
        [
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n"
        ]
    )
    response = http(server.url())
    assert (response.status, response.body) == (200, b"abc")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n", id="chunk-size"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
            id="no-crlf-after-chunk",
        ),
        pytest.param(b"SSH-2.0-OpenSSH_9.2\r\n\r\n", id="garbage-status-line"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n", id="200KB-header"
        ),
    ],
)
def test_malformed_answers_are_failed_attempts(http, serve, answer):
    server = serve([answer, None])
    started = time.monotonic()
    response = http(server.url(), timeout=5.0)
    assert response.status is None, response.body
    assert response.error and response.error.startswith("curl error")
    assert time.monotonic() - started < 4  # recognised, not timed out


def test_a_100kb_header_line_is_read_as_the_valid_answer_it_is(http, serve):
    """RFC 9112 sets no limit on a header line: a 100 KB one is legal and read as such.
    libcurl bounds each line (100 KiB) and the whole head (300 KiB), so what is kept of
    headers is bounded too; a longer line is a failed attempt (the case above)."""
    big = b"a" * 100_000
    server = serve([b"HTTP/1.1 200 OK\r\nx-big: " + big + b"\r\ncontent-length: 0\r\n\r\n"])
    response = http(server.url())
    assert response.status == 200
    assert response.headers.get("x-big") == big.decode()


def test_a_connection_closed_half_way_through_a_body_is_a_failed_attempt(http, serve):
    server = serve([b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-part", None])
    response = http(server.url())
    assert response.status is None
    assert response.error is not None and "curl error 18" in response.error  # partial file


def test_a_body_that_drips_ends_at_the_attempt_budget(http, serve):
    server = serve([b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n", *drip(b"x" * 50, 1.0)])
    started = time.monotonic()
    response = http(server.url(), timeout=0.5)
    elapsed = time.monotonic() - started
    assert response.status is None and response.timed_out and response.error == "timeout"
    assert elapsed < 1.5


def test_a_2xx_over_the_size_limit_is_an_answer_read_no_further(http, serve):
    chunk = b"y" * 65536
    body_steps: list[Step] = [chunk] * 200  # 12.5 MiB, far past the limit
    head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(chunk) * 200}\r\n\r\n".encode()
    server = serve([head, *body_steps])
    response = http(server.url(), reading=Reading(keep=1000, limit=100_000))
    assert response.status == 200
    assert response.truncated
    assert response.body == b"y" * 1000  # kept: what was asked for, never more
    # curl stopped reading: the server could not send the rest.
    assert server.send_failed.wait(5)


def test_an_error_body_past_keep_is_truncated_but_the_connection_kept(http, serve):
    server = serve(lambda _i: ok(400, b"e" * 10_000))
    first = http(server.url(), reading=Reading(keep=4096, limit=64 * 1024))
    second = http(server.url())
    assert first.status == 400 and first.truncated and len(first.body) == 4096
    assert second.status == 400
    assert server.accepted == 1  # read to the end (under the limit): reused


# ----------------------------------------------------------------- what is sent, how


def test_keep_alive_http_1_1_and_no_headers_curl_would_invent(http, serve):
    server = serve(lambda _i: ok(202))
    for _ in range(3):
        assert http(server.url("/in"), b"x" * 2_000_000).status == 202  # > 1 MiB: no Expect
    assert server.accepted == 1
    request = server.requests[0]
    assert request.request_line == "POST /in HTTP/1.1"
    assert request.header("expect") is None
    assert request.header("content-type") is None
    assert request.header("user-agent") == "dispatcher"
    assert len(request.body) == 2_000_000


def test_a_percent_encoded_path_arrives_as_written(http, serve):
    server = serve(lambda _i: ok())
    http(server.url("/a%20b/c?x=%2F"))
    assert server.requests[0].request_line == "POST /a%20b/c?x=%2F HTTP/1.1"


def test_user_and_password_in_the_url_are_sent_as_basic_auth(http, serve):
    server = serve(lambda _i: ok())
    http(f"http://us%40r:pa%20ss@127.0.0.1:{server.port}/")
    expected = base64.b64encode(b"us@r:pa ss").decode()
    assert server.requests[0].header("authorization") == f"Basic {expected}"


def test_redirects_are_answers_never_followed(http, serve):
    server = serve(lambda _i: ok(302, extra=b"location: http://127.0.0.1:9/elsewhere\r\n"))
    response = http(server.url())
    assert response.status == 302
    assert response.headers.get("location") == "http://127.0.0.1:9/elsewhere"
    assert len(server.requests) == 1


def http_date(offset: float) -> str:
    return email.utils.formatdate(time.time() + offset, usegmt=True)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("7", 7.0),
        (30.0, 30.0),  # an HTTP date 30 s from now
        (-30.0, None),  # a date in the past: no wait
        ("soon", None),
        ("-5", None),
        ("1.5", 1.0),  # not RFC 9110 (digits only); curl reads the leading digits
    ],
)
def test_retry_after_is_read_by_curl(http, serve, value, seconds):
    header = http_date(value) if isinstance(value, float) else value
    server = serve(lambda _i: ok(503, extra=f"Retry-After: {header}\r\n".encode()))
    response = http(server.url(), reading=Reading(keep=0, limit=100))
    assert response.status == 503
    if seconds is None:
        assert response.retry_after is None
    else:
        assert response.retry_after == pytest.approx(seconds, abs=2)


def test_headers_are_kept_only_when_asked_for(http, serve):
    server = serve(lambda _i: ok(200, extra=b"ce-id: reply-1\r\n"))
    assert http(server.url(), reading=Reading(keep=10, limit=100)).headers == {}
    kept = http(server.url(), reading=Reading(keep=10, limit=100, headers=True))
    assert kept.headers.get("ce-id") == "reply-1"
    assert http(server.url(), reading=Reading(keep=10, limit=100)).headers == {}  # and off again


def test_headers_are_read_from_the_final_response(http, serve):
    server = serve(
        [
            b"HTTP/1.1 100 Continue\r\nx-a: early\r\n\r\nHTTP/1.1 200 OK\r\nX-A: late\r\n"
            b"Retry-After: 3\r\ncontent-length: 0\r\n\r\n"
        ]
    )
    response = http(server.url())
    assert response.headers == {"x-a": "late", "retry-after": "3", "content-length": "0"}


# ----------------------------------------------------------------- proxies and TLS


def test_the_proxy_environment_is_followed_as_curl_and_httpx_do(http, serve):
    proxy = serve(lambda _i: ok(204))
    env = {"HTTP_PROXY": f"127.0.0.1:{proxy.port}", "NO_PROXY": "example.internal"}
    via = endpoint("http://subscriber.example:8080/hook", TlsSettings(), env, "subscriber")
    assert http(via).status == 204
    # Absolute form: the request went to the proxy, for the subscriber.
    assert proxy.requests[0].request_line == "POST http://subscriber.example:8080/hook HTTP/1.1"


def test_no_proxy_and_lower_case_names_win(serve, http):
    direct = serve(lambda _i: ok(201))
    env = {
        "http_proxy": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:8",
        "NO_PROXY": "127.0.0.1",
    }
    chosen = endpoint(direct.url(), TlsSettings(), env, "subscriber")
    assert chosen.proxy == "http://127.0.0.1:9"
    assert http(chosen).status == 201  # NO_PROXY: straight to the subscriber


@pytest.mark.parametrize("value", ["ftp://proxy:21", "http://:8080", "http://[bad"])
def test_a_proxy_that_is_not_a_proxy_url_names_its_variable(value):
    with pytest.raises(ConfigError) as caught:
        endpoint(
            "https://x.example/", TlsSettings(), {"HTTPS_PROXY": value}, "bindings[0].subscriber"
        )
    assert caught.value.key == "HTTPS_PROXY"
    assert "bindings[0].subscriber" in str(caught.value)


def test_a_proxy_password_is_never_in_the_error():
    with pytest.raises(ConfigError) as caught:
        endpoint("https://x/", TlsSettings(), {"HTTPS_PROXY": "gopher://u:s3cret@p/"}, "k")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("password", ["Corp Proxy 2024", "tab\there", "ctl\x01", "Ünïcode"])
def test_a_proxy_password_curl_cannot_use_is_refused_at_start(password):
    """Pasted without percent-encoding: curl would refuse it at every request
    (quoting it whole in its error), pycurl cannot hand over a non-ASCII one."""
    with pytest.raises(ConfigError) as caught:
        endpoint("http://x/", TlsSettings(), {"http_proxy": f"http://u:{password}@p:3128"}, "k")
    assert caught.value.key == "http_proxy"
    assert "percent-encoded" in str(caught.value)
    assert password not in str(caught.value)


def test_a_url_curl_quotes_in_its_error_is_redacted(http):
    """What ``endpoint`` lets through must still never reach a log line whole:
    curl's own error text quotes a proxy URL it cannot parse."""
    refused = Endpoint("http://127.0.0.1:9/", TlsSettings(), "http://u:pa ss@127.0.0.1:9")
    response = http(refused)
    assert response.status is None and response.error is not None
    assert "pa ss" not in response.error and "***" in response.error


@pytest.fixture(scope="module")
def tls_material(tmp_path_factory) -> Path:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


def _server_context(material: Path, require_client: bool) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(material / "server.pem", material / "server.key")
    if require_client:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(material / "ca.pem")
    return context


def test_https_with_the_binding_ca_and_client_certificate(http, serve, tls_material):
    server = serve(lambda _i: ok(200), tls=_server_context(tls_material, require_client=True))
    tls = TlsSettings(
        ca_file=str(tls_material / "ca.pem"),
        cert_file=str(tls_material / "client.pem"),
        key_file=str(tls_material / "client.key"),
    )
    assert http(Endpoint(server.url(), tls)).status == 200
    assert http(Endpoint(server.url(), tls)).status == 200
    assert server.accepted == 1  # TLS connections are kept alive too


def test_https_refuses_a_server_its_ca_did_not_sign(http, serve, tls_material):
    server = serve(lambda _i: ok(200), tls=_server_context(tls_material, require_client=False))
    response = http(server.url())  # the system's CAs: they never signed the test CA
    assert response.status is None
    assert response.error is not None and "curl error 60" in response.error


def test_a_steady_stream_of_requests_keeps_one_curl_timer(serve):
    """Invariant 8 (memory bounded): each request added to curl schedules a kick;
    the kick dropped the armed deadline timer without cancelling it, which then
    fired and re-armed on its own: one more live timer per kick, growing for as
    long as requests kept coming (70 to 1,292 in 8 s in the review's run)."""
    server = serve(lambda _i: [0.05, *ok()])  # each answer after 50 ms
    loop = Loop()
    client = HttpClient(loop, 40)
    target = Endpoint(server.url())
    live_curl_timers: list[int] = []

    async def sender(start: float) -> None:
        await Waits(loop).sleep(start)
        for _ in range(15):
            await client.post(target, request_headers({}), b"{}", 30.0, BOUNDS)

    async def watch() -> None:
        for _ in range(40):
            await Waits(loop).sleep(0.025)
            live = [t for _, _, t in loop._timers if not t.cancelled]
            live_curl_timers.append(
                sum(1 for t in live if t.callback == client._multis[0]._on_timer)
            )

    async def main() -> None:
        tasks = [loop.spawn(sender(i * 0.003)) for i in range(30)]
        await loop.spawn(watch()).finished
        for task in tasks:
            await task.finished

    try:
        loop.run_until_complete(main())
    finally:
        client.close()
        loop.close()
    assert max(live_curl_timers) <= 1, live_curl_timers
