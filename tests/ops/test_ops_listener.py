"""The operations listener under hostile clients, in a real `dispatcher run` process.

A port scan, a load balancer that half-opens connections, clients that send
half a request line, junk or a byte now and then: none of it may put a
traceback in the service's output (every line there is JSON, for the log
pipelines that read it), cost a kubelet probe its answer, grow the service's
threads, or take the file descriptors its deliveries need.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from dispatcher.ops.server import METRICS_SHARED_FOR, OpsServer, unsent
from tests.support import broker
from tests.support.broker import wait_until
from tests.support.process import DispatcherProcess, child_env

BURST = 1000  # connections of each kind that come and go
# Clients that stay while the probe runs: more than the service's descriptor
# limit (below), so a listener that held them all would run out.
SLOW = 1500
DRIPPING = 300  # of those, the ones that send their head a byte at a time
# The service's limit on open files, soft and hard (``--ulimit nofile=1024:1024``):
# the service raises its soft limit to the hard one, so a low hard limit is the
# case where hostile clients could take every descriptor.
DESCRIPTORS = 1024


@pytest.fixture
def service(tmp_path: Path) -> Iterator[DispatcherProcess]:
    queue = broker.unique("ops-hostile")
    config = {
        "broker": {"url": broker.URL},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": "2s"},
        # The lines hostile clients may cost are debug lines: count them.
        "logging": {"level": "debug"},
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
        # Set on the child as soon as it exists, long before the interpreter has
        # imported the service; the "listening" line says whether it was in force.
        limit = (DESCRIPTORS, DESCRIPTORS)
        resource.prlimit(process.popen.pid, resource.RLIMIT_NOFILE, limit)
        process.wait_for("consumer attached", binding="hostile")
        yield process
    finally:
        process.kill()
        broker.delete([queue])


@pytest.mark.broker
def test_hostile_clients_leave_no_traceback_and_cost_no_probe(service: DispatcherProcess) -> None:
    listening = service.wait_for("listening")
    port = listening["port"]
    assert listening["max_connections"] == DESCRIPTORS // 4, "the limit was set too late"
    pid = service.popen.pid
    threads_before = threads(pid)

    for kind in ("connect-and-close", "reset", "half-a-request-line", "junk"):
        for n in range(BURST):
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                # A connect that waited for a SYN retransmit (the backlog was full)
                # took a second or more: what makes a kubelet probe time out.
                took = time.monotonic() - started
                assert took < 1.0, f"connect {n} of {kind!r} took {took:.1f} s"
                if kind == "reset":  # close with RST, as a port scanner does
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                elif kind == "half-a-request-line":
                    sock.sendall(b"GET /rea")
                elif kind == "junk":
                    sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64))

    with contextlib.ExitStack() as held:
        slow = [
            held.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            for _ in range(SLOW)
        ]
        for sock in slow[DRIPPING:]:
            send(sock, b"GET /readyz HTTP/1.1\r\nHost: slow\r\n")  # the head never ends
        head = b"GET /readyz HTTP/1.1\r\nHost: dripping\r\n"
        for i in range(len(head)):  # a byte each, round after round, while probes run
            for sock in slow[:DRIPPING]:
                send(sock, head[i : i + 1])
            started = time.monotonic()
            status, body = get(port, "/readyz")
            answered = time.monotonic() - started
            assert (status, body) == (200, {"ready": True})
            assert answered < 1.0, f"/readyz took {answered:.2f} s in round {i}"
        assert threads(pid) == threads_before
        # Held connections are a share of the descriptor limit, never all of it:
        # the rest are for the subscribers' connections and the broker's.
        assert descriptors(pid) <= DESCRIPTORS // 2, descriptors(pid)

    # Still answering afterwards, and nothing but JSON lines in the output
    # (stderr is merged into it by DispatcherProcess).
    assert get(port, "/healthz")[0] == 200
    raw = service.output().splitlines()
    assert [line for line in raw if not is_json(line)] == []
    assert not any("Traceback" in line or "Exception occurred" in line for line in raw)
    # At most one debug line per hostile client (a listener that spun on a
    # failing accept would write thousands a second).
    ops_lines = [line for line in raw if '"ops ' in line]
    assert len(ops_lines) <= 4 * BURST + SLOW, ops_lines[-5:]


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


@pytest.mark.parametrize(("host", "reached"), [("::1", ["::1"]), ("::", ["::1", "127.0.0.1"])])
def test_an_ipv6_listen_address_is_listened_on(host: str, reached: list[str]) -> None:
    """``check`` took ``[::]:9090`` (the docs' own example) and ``run`` exited 2 with
    "Address family for hostname not supported": an IPv4 socket was asked for it.
    ``[::]`` takes IPv4 clients too where the system can (a dual-stack pod)."""
    server = OpsServer(host, 0, CollectorRegistry(), time.monotonic, dict, lambda: False)
    server.start()
    try:
        for address in reached if socket.has_dualstack_ipv6() else reached[:1]:
            with socket.create_connection((address, server.port), timeout=5) as sock:
                sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                assert sock.recv(64).startswith(b"HTTP/1.0 200 ")
    finally:
        server.close()


class Renders:
    """A collector that counts how often the registry is rendered."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.count += 1
        yield GaugeMetricFamily("renders", "how often /metrics was rendered", value=self.count)


def test_a_flood_of_scrapes_shares_renders() -> None:
    """40 bindings make /metrics 117 KB and 7.5 ms of CPU under the GIL: a hundred
    scrapes a second delayed deliveries by seconds, and 2,500 clients that never
    read held a copy each (RSS past the chart's 256 MiB limit)."""
    now = [100.0]
    registry = CollectorRegistry()
    renders = Renders()
    registry.register(renders)
    server = OpsServer(
        "127.0.0.1", 0, registry, time.monotonic, dict, lambda: False, lambda: now[0]
    )
    server.start()

    def scrape() -> bytes:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer

    try:
        answers = [scrape() for _ in range(30)]  # within the same tenth of a second
        assert renders.count == 1
        assert all(a.startswith(b"HTTP/1.0 200 ") and b"renders 1.0" in a for a in answers)
        now[0] += 2 * METRICS_SHARED_FOR
        assert b"renders 2.0" in scrape()  # a scrape after it sees the registry now
    finally:
        server.close()


def test_head_is_answered_as_get_without_the_body() -> None:
    """``curl -I /healthz`` got 501."""
    server = OpsServer("127.0.0.1", 0, CollectorRegistry(), time.monotonic, dict, lambda: False)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"HEAD /healthz HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 ") and b"content-length: 15" in head
        assert body == b""
    finally:
        server.close()


def test_what_is_left_to_send_of_an_answer_in_parts() -> None:
    head, body = memoryview(b"head"), memoryview(b"body!")
    assert [bytes(p) for p in unsent([head, body], 0)] == [b"head", b"body!"]
    assert [bytes(p) for p in unsent([head, body], 2)] == [b"ad", b"body!"]
    assert [bytes(p) for p in unsent([head, body], 4)] == [b"body!"]
    assert [bytes(p) for p in unsent([head, body], 6)] == [b"dy!"]
    assert unsent([head, body], 9) == []
    assert unsent([head, memoryview(b"")], 4) == []


# A listener in a process whose every descriptor is taken (by other parts of it),
# until a line on stdin gives them back.
STARVED = """
import json, resource, sys, threading, time
from prometheus_client import CollectorRegistry
from dispatcher.observe import logs
from dispatcher.ops.server import OpsServer
logs.configure("debug", "json")
resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))  # few, so all are soon taken
server = OpsServer("127.0.0.1", 0, CollectorRegistry(), time.monotonic, dict, lambda: False)
server.start()
taken = []
try:
    while True:
        taken.append(open("/dev/null"))
except OSError:
    pass
print(json.dumps({"event": "starved", "port": server.port}), flush=True)
sys.stdin.readline()
for f in taken:
    f.close()
threading.Event().wait()
"""


def test_out_of_descriptors_the_listener_waits_without_spinning() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", STARVED],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    assert child.stdout is not None and child.stdin is not None

    def read(stream: IO[str]) -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, args=(child.stdout,), daemon=True).start()
    try:
        starved = wait_until(lambda: [x for x in lines if '"starved"' in x], 10, "starved")
        port = json.loads(starved[0])["port"]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as probe:
            probe.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            wait_until(lambda: any('"ops listener' in x for x in lines), 5, "a failed accept")
            cpu_before = cpu_seconds(child.pid)
            # No descriptor, no answer; but the listener must not spin meanwhile
            # (it did: a CPU and thousands of debug lines a second).
            probe.settimeout(0.5)
            with pytest.raises(TimeoutError):
                probe.recv(1)
            assert cpu_seconds(child.pid) - cpu_before < 0.2
            child.stdin.write("give them back\n")
            child.stdin.flush()
            probe.settimeout(5)  # resumed within a tenth of a second
            assert probe.recv(64).startswith(b"HTTP/1.0 200 ")
        ops_lines = [x for x in lines if '"ops ' in x]
        assert len(ops_lines) == 1 and '"ops listener paused"' in ops_lines[0], ops_lines[:3]
        assert all(is_json(x) for x in lines), lines
    finally:
        child.kill()
        child.wait(10)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send(sock: socket.socket, data: bytes) -> None:
    # The listener closes the oldest slow clients to stay within its limit.
    with contextlib.suppress(OSError):
        sock.sendall(data)


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


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
