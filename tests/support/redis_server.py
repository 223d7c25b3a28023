"""Redis for tests: the shared one at 127.0.0.1:6379 (own key prefix, cleaned up)
and disposable ``redis-server`` processes that fault tests kill, pause and restart.

The shared Redis is never stopped, paused or reconfigured.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

import redis

from tests.support.node import free_port

SHARED_URL = "redis://127.0.0.1:6379/0"


def delete_binding_keys(binding: str, url: str = SHARED_URL) -> int:
    """Remove what a test's binding left in the store (its keys only)."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"dispatcher:dedupe:{binding}:*", count=1000))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def binding_keys(binding: str, url: str = SHARED_URL) -> dict[str, str]:
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    try:
        keys = client.scan_iter(match=f"dispatcher:dedupe:{binding}:*", count=1000)
        return {key: str(client.get(key)) for key in keys}
    finally:
        client.close()


class RedisServer:
    """A ``redis-server`` of the test's own on a free port, no persistence."""

    def __init__(self, cluster: bool = False, tls: Path | None = None) -> None:
        """``cluster``: a Redis Cluster node (its slots left for the test to assign);
        ``tls``: TLS only, with ``make_tls_material``'s files in that directory."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is not installed (make test installs it: .ci/redis)")
        self._binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-server-")
        # A cluster node also listens on a bus port, port + 10000 unless told:
        # that lands in the kernel's ephemeral range, where an outgoing
        # connection may hold it, and the node exits at once.
        self._options: tuple[str, ...] = ()
        if cluster:
            bus = str(free_port())
            self._options = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
            self._options += ("--cluster-port", bus)
        self.tls = tls
        if tls is not None:
            self._options += ("--port", "0", "--tls-port", str(self.port))
            self._options += ("--tls-cert-file", str(tls / "server.pem"))
            self._options += ("--tls-key-file", str(tls / "server.key"))
            self._options += ("--tls-ca-cert-file", str(tls / "ca.pem"))
            self._options += ("--tls-auth-clients", "no")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={self.tls / 'ca.pem'}"
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: Any) -> redis.Redis:
        """A client of the test's own (plain or TLS, as the server is)."""
        return redis.Redis.from_url(self.url, **options)  # type: ignore[no-any-return]

    def start(self) -> RedisServer:
        """Start (again, empty: nothing is saved) and wait until it answers."""
        # The server's own words, appended across restarts, for a start that fails.
        with open(Path(self.dir, "server.log"), "ab") as log:
            self.proc = self._popen(log)
        deadline = time.monotonic() + 20
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = Path(self.dir, "server.log").read_text(errors="replace")[-2000:]
                raise AssertionError(f"redis-server on port {self.port} did not start:\n{tail}")
            time.sleep(0.05)
        return self

    def _popen(self, log: BinaryIO) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                self._binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                *self._options,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def answers(self) -> bool:
        client = self.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def keys(self) -> dict[str, str]:
        client = self.client(socket_timeout=5, decode_responses=True)
        try:
            return {key: str(client.get(key)) for key in client.scan_iter(count=1000)}
        finally:
            client.close()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
