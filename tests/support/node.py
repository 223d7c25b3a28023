"""A disposable RabbitMQ node for fault tests: stop it, restart it, close its connections.

Never the shared broker at 5672: each node gets its own name, free ports,
data directory and log directory, and is shut down at teardown.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pika


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    """A port nothing listens on now, for a server a test is about to start.

    Not one ``bind(0)`` hands out: that is the kernel's ephemeral range, from
    which it also picks the local port of every outgoing connection, and a
    broker node boots for seconds before it binds its ports; a connection
    made meanwhile can take one (the node then fails to start, reporting
    only ``rabbit_is_not_running``). Below that range only listeners bind,
    and this process never hands the same port out twice. Under pytest-xdist
    each worker draws from its own residue class, so two workers never hand
    out one port between them either (a node boots for seconds before it
    binds, so binding here cannot tell that another worker chose it).
    """
    low = _ephemeral_low()
    share, shares = _worker_share()
    for _ in range(1000):
        port = random.randrange(_LOWEST, low)
        if port % shares != share or port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError(f"no free port between {_LOWEST} and {low}")


_LOWEST = 10_000
_GIVEN: set[int] = set()


def _worker_share() -> tuple[int, int]:
    """(this worker's index, how many workers): (0, 1) outside pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return 0, 1
    return int(worker[2:]) % count, count


def _ephemeral_low() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    except OSError:
        return 32_768  # Linux's default
    return int(text.split()[0])


class RabbitNode:
    def __init__(self, advanced_config: str | None = None, tls: Path | None = None) -> None:
        self.name = f"faults-{uuid.uuid4().hex[:8]}@localhost"
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.dir = Path(tempfile.mkdtemp(prefix="rabbit-node-"))
        lines = [
            f"listeners.tcp.default = 127.0.0.1:{self.port}",
            "loopback_users = none",
        ]
        if tls is not None:
            lines += [
                f"listeners.ssl.default = 127.0.0.1:{self.tls_port}",
                f"ssl_options.cacertfile = {tls / 'ca.pem'}",
                f"ssl_options.certfile = {tls / 'server.pem'}",
                f"ssl_options.keyfile = {tls / 'server.key'}",
                "ssl_options.verify = verify_peer",
                "ssl_options.fail_if_no_peer_cert = true",
            ]
        (self.dir / "mnesia").mkdir()
        (self.dir / "log").mkdir()
        (self.dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        # No plugins: the management API's lists lag or come back empty for
        # live state; rabbitmqctl answers these tests, and the node starts faster.
        (self.dir / "enabled_plugins").write_text("[].\n")
        if advanced_config:
            (self.dir / "advanced.config").write_text(advanced_config)
        self.env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_PID_FILE": str(self.dir / "pid"),
        }

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> RabbitNode:
        # The server runs as user rabbitmq: its files must be its own.
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.dir)], check=True)
        subprocess.run(
            ["rabbitmq-server", "-detached"],
            env=self.env,
            check=True,
            timeout=60,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            self.ctl("wait", str(self.dir / "pid"), timeout=120)
        except AssertionError as e:
            # Teardown removes the node's folder: say why it did not start now.
            raise AssertionError(f"{e}\n{self.log_tail()}") from None
        self.wait_accepting()
        return self

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the node's logs (a failed boot says why there)."""
        said = []
        for log in sorted((self.dir / "log").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            said.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(said) or "(no node log)"

    def shutdown(self) -> None:
        """Stop the node for good: a leaked node would hold ports and memory across runs."""
        pid_file = self.dir / "pid"
        pid = int(pid_file.read_text().strip()) if pid_file.exists() else None
        try:
            self.ctl("shutdown", timeout=60, check=False)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if pid is not None and _alive(pid):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_app(self) -> None:
        self.ctl("stop_app")

    def start_app(self) -> float:
        """Start the app again; returns when it was back (before our own probe connected)."""
        self.ctl("start_app")
        back = time.monotonic()
        self.wait_accepting()
        return back

    def ctl(self, *args: str, timeout: float = 60, check: bool = True) -> str:
        result = subprocess.run(
            ["rabbitmqctl", "-n", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"rabbitmqctl {' '.join(args)} failed: {result.stderr[-500:]}")
        return result.stdout

    def eval(self, expression: str, timeout: float = 120) -> str:
        return self.ctl("eval", expression, timeout=timeout).strip()

    def wait_accepting(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pika.BlockingConnection(pika.URLParameters(self.url)).close()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # ----------------------------------------------------------------- inspection

    def connection_names(self) -> list[str]:
        """Live client connection names (the management API's lists lag or come back empty)."""
        out = self.ctl("-q", "list_connections", "client_properties")
        return re.findall(r'\{"connection_name","([^"]*)"\}', out)

    def channel_count(self) -> int:
        out = self.ctl("-q", "list_channels", "pid")
        return sum(1 for line in out.splitlines() if line.startswith("<"))

    def consumers(self, queue: str) -> int:
        expression = (
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>)),'
            " length(rabbit_amqqueue:consumers(Q))."
        )
        return int(self.eval(expression))

    def close_all_connections(self) -> None:
        self.eval(
            '[rabbit_networking:close_connection(P, "fault test") '
            "|| P <- rabbit_networking:connections()], ok."
        )

    def unacked(self, queue: str) -> int:
        return self._queue_column(queue, "messages_unacknowledged")

    def ready_messages(self, queue: str) -> int:
        return self._queue_column(queue, "messages_ready")

    def _queue_column(self, queue: str, column: str) -> int:
        for line in self.ctl("-q", "list_queues", "name", column).splitlines():
            parts = line.split()
            if parts and parts[0] == queue:
                return int(parts[1])
        raise AssertionError(f"queue {queue} not on the node")


def make_tls_material(directory: Path) -> Path:
    """A self-signed CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    for name, extension in (
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(extension + "\n")
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
        )
    subprocess.run(["chmod", "-R", "a+rX", str(directory)], check=True)
    for path in directory.iterdir():
        path.chmod(0o644)
    return directory
