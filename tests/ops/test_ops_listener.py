"""The operations listener under hostile clients, in a real `dispatcher run` process.

A port scan, a load balancer that half-opens connections, clients that send
half a request line, junk or a byte now and then: none of it may put a
traceback in the service's output (every line there is JSON, for the log
pipelines that read it), cost a kubelet probe its answer, or grow the
service's threads.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from dispatcher.http.server import OpsServer
from tests.support import broker
from tests.support.process import DispatcherProcess

BURST = 1000  # connections of each kind
SLOW = 500  # clients that keep sending nothing useful while the probe runs


@pytest.fixture
def service(tmp_path: Path) -> Iterator[DispatcherProcess]:
    queue = broker.unique("ops-hostile")
    config = {
        "broker": {"url": broker.URL},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": "2s"},
        "bindings": [
            {
                "name": "hostile",
                "queue": queue,
                "subscriber": "http://127.0.0.1:9/",
                "declare": {"durable": True},
            }
        ],
    }
    process = DispatcherProcess(config, tmp_path)
    try:
        process.wait_for("consumer attached", binding="hostile")
        yield process
    finally:
        process.kill()
        broker.delete([queue])


@pytest.mark.broker
def test_hostile_clients_leave_no_traceback_and_cost_no_probe(service: DispatcherProcess) -> None:
    port = service.wait_for("listening")["port"]
    threads_before = threads(service.popen.pid)

    for kind in ("connect-and-close", "half-a-request-line", "junk"):
        for n in range(BURST):
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                # A connect that waited for a SYN retransmit (the backlog was full)
                # took a second or more: what makes a kubelet probe time out.
                took = time.monotonic() - started
                assert took < 1.0, f"connect {n} of {kind!r} took {took:.1f} s"
                if kind == "half-a-request-line":
                    sock.sendall(b"GET /rea")
                elif kind == "junk":
                    sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64))

    with contextlib.ExitStack() as held:
        for _ in range(SLOW):
            sock = held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: slow\r\n")  # the head never ends
        started = time.monotonic()
        status, body = get(port, "/readyz")
        answered = time.monotonic() - started
        assert (status, body) == (200, {"ready": True})
        assert answered < 1.0, answered
        assert threads(service.popen.pid) == threads_before

    # Still answering afterwards, and nothing but JSON lines in the output
    # (stderr is merged into it by DispatcherProcess).
    assert get(port, "/healthz")[0] == 200
    raw = service.output().splitlines()
    assert [line for line in raw if not is_json(line)] == []
    assert not any("Traceback" in line or "Exception occurred" in line for line in raw)


@pytest.mark.parametrize("head", [b"GET /healthz HTTP/1.0\n\n", b"GET /healthz HTTP/1.0\n\r\n"])
def test_a_head_with_bare_line_feeds_is_answered(head: bytes) -> None:
    # http.server reads such a head; a listener waiting for CRLF CRLF would hold a
    # hand-typed `printf ... | nc` probe until its deadline and answer nothing.
    server = OpsServer("127.0.0.1", 0, CollectorRegistry(), time.monotonic, dict, lambda: False)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(head)
            assert sock.recv(64).startswith(b"HTTP/1.0 200 ")
    finally:
        server.close()


def get(port: int, path: str) -> tuple[int, object]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
