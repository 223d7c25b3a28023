"""Where events land: nginx (fast, 202 at once) or the asyncio subscriber (optional delay).

Both write a receipt log, one line per request: ``<epoch seconds> <ce-id>
<ce-benchpublished or ->``. nginx writes it with ``access_log`` (``$msec``,
millisecond resolution, unbuffered); the asyncio subscriber with microsecond
resolution, flushed every 50 ms. The bench tails the log to see progress and
reads it whole at the end: throughput, duplicates, missing ids and latency all
come from it, never from what a contender says about itself.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from tests.bench.harness import CHILDREN, PYTHON, ROOT, BenchError, free_port, port_open, tail

NGINX_HELP: Final = (
    "bench: nginx is not installed; W1, W4 and W5 use it as the fast subscriber.\n"
    "       Install it with: apt-get install -y nginx-light"
)

NGINX_CONF: Final = """\
daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format receipt '$msec $http_ce_id $http_ce_benchpublished';
    access_log off;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            access_log {log} receipt;
            return 202;
        }}
        # A trace collector that takes every export (the traced contenders).
        location = /v1/traces {{
            return 200;
        }}
    }}
}}
"""


@dataclass(frozen=True, slots=True)
class Receipt:
    event_id: str
    at: float
    published: float | None


class ReceiptLog:
    """Tails a receipt log; ``poll`` returns how many distinct ids arrived so far.

    The file is read through one handle opened when it first appears, so the
    count cannot be fooled by the path being removed or replaced meanwhile.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._partial = b""
        self._ids: set[bytes] = set()

    def _handle(self) -> BinaryIO | None:
        if self._file is None:
            try:
                self._file = self.path.open("rb")
            except FileNotFoundError:
                return None  # not created yet (a contender writing its own log)
        return self._file

    def poll(self) -> int:
        log = self._handle()
        if log is None:
            return 0
        lines = (self._partial + log.read()).split(b"\n")
        self._partial = lines.pop()
        self._ids.update(line.split(b" ", 2)[1] for line in lines if line)
        return len(self._ids)

    def receipts(self) -> list[Receipt]:
        """Every line, read from the start; closes the log."""
        log = self._handle()
        if log is None:
            raise BenchError(f"no receipt log at {self.path}")
        with log:
            log.seek(0)
            text = log.read().decode()
        self._file = None
        found = []
        for line in text.splitlines():
            at, event_id, published = line.split(" ")
            found.append(
                Receipt(event_id, float(at), None if published == "-" else float(published))
            )
        return found


@dataclass(slots=True)
class Sink:
    """A running subscriber."""

    kind: str
    url: str
    log: ReceiptLog
    delay: float
    proc: subprocess.Popen[bytes]
    output: Path

    def stop(self) -> None:
        CHILDREN.stop(self.proc, grace=10.0)


def _wait_listening(proc: subprocess.Popen[bytes], port: int, output: Path) -> None:
    deadline = time.monotonic() + 10
    while not port_open(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BenchError(f"subscriber did not start on port {port}:\n{tail(output)}")
        time.sleep(0.02)


def nginx_available() -> bool:
    return shutil.which("nginx") is not None or Path("/usr/sbin/nginx").exists()


def start_nginx(workdir: Path) -> Sink:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    port, log = free_port(), workdir / "receipts.log"
    conf = workdir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=workdir, port=port, log=log))
    output = workdir / "nginx.out"
    argv = [nginx, "-e", str(workdir / "nginx-error.log"), "-p", str(workdir), "-c", str(conf)]
    proc = CHILDREN.spawn(argv, output)
    _wait_listening(proc, port, output)
    return Sink("nginx", f"http://127.0.0.1:{port}/", ReceiptLog(log), 0.0, proc, output)


def start_asyncio(workdir: Path, delay: float, status: int = 202) -> Sink:
    port, log, output = free_port(), workdir / "receipts.log", workdir / "subscriber.out"
    script = ROOT / "tests/bench/fast_subscriber.py"
    argv = [PYTHON, str(script), str(port), "--delay", str(delay), "--log", str(log)]
    argv += ["--status", str(status)]
    proc = CHILDREN.spawn(argv, output)
    _wait_listening(proc, port, output)
    return Sink("asyncio", f"http://127.0.0.1:{port}/", ReceiptLog(log), delay, proc, output)
