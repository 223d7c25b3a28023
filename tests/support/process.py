"""A real `dispatcher run` process for tests: config in, log lines and HTTP probes out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

ROOT = Path(__file__).resolve().parents[2]

# Every variable the service reads (``dispatcher/config/sources.py``'s overrides,
# ``dispatcher/config/knative.py``'s drop-in mode, the HTTP client's proxies). A
# test decides these itself: the caller's must not reach the code under test
# (tests/conftest.py removes them from this process, ``child_env`` from children).
# tests/unit/test_caller_environment.py checks the list against the code.
SERVICE_VARIABLES: Final = frozenset(
    {
        # config file and overrides
        "DISPATCHER_CONFIG",
        "RABBITMQ_URL",
        "DEDUPE_STORE_URL",
        "DISPATCHER_LISTEN",
        "LOG_LEVEL",
        "LOG_FORMAT",
        # Knative drop-in mode
        "QUEUE_NAME",
        "SUBSCRIBER",
        "RABBIT_URL",
        "RABBITMQ_VHOST",
        "RETRY",
        "BACKOFF_POLICY",
        "BACKOFF_DELAY",
        "TIMEOUT",
        "PARALLELISM",
        "DLX_NAME",
        "DEAD_LETTER_SINK",
        "BROKER_INGRESS_URL",
        "SUBSCRIBER_CACERTS",
        "K_OBSERVABILITY_CONFIG",
        # OpenTelemetry's own (config/otel.py; the SDK reads the rest itself)
        "OTEL_SDK_DISABLED",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_SERVICE_NAME",
        "OTEL_TRACES_SAMPLER",
        "OTEL_TRACES_SAMPLER_ARG",
        # the HTTP client follows proxies as curl does
        *(f"{scheme}_proxy" for scheme in ("http", "https", "all", "no")),
        *(f"{scheme}_PROXY" for scheme in ("HTTP", "HTTPS", "ALL", "NO")),
    }
)
# What a child process needs of the caller's environment: finding programs and
# libraries, a home, a temporary folder, the locale and the CA store.
_PASSED: Final = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "TZ", "LANG", "LANGUAGE", "LD_LIBRARY_PATH"}
    | {"SSL_CERT_FILE", "SSL_CERT_DIR", "SYSTEMROOT"}
)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process of the service's code: a clean base (the
    necessities above, ``PYTHONPATH`` the repository) plus ``extra``. Nothing else of
    the caller's, so a ``RABBITMQ_URL`` or ``LOG_LEVEL`` set where the tests were
    started cannot override what a test configured."""
    base = {
        name: value
        for name, value in os.environ.items()
        if (name in _PASSED or name.startswith("LC_")) and name not in SERVICE_VARIABLES
    }
    # Unbuffered, as in the image: a line is out when it is written.
    return {**base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(extra or {})}


class DispatcherProcess:
    def __init__(
        self,
        config: dict[str, Any] | None,
        directory: Path,
        env: dict[str, str] | None = None,
        read: bool = True,
    ) -> None:
        """``read=False``: nobody reads the process's stdout until ``start_reading``
        (a pipe that fills, as a stuck log shipper's would)."""
        args = [sys.executable, "-m", "dispatcher", "run"]
        if config is not None:
            path = directory / "dispatcher.yaml"
            path.write_text(yaml.safe_dump(config))
            args += ["--config", str(path)]
        # Without --config, run from a folder with no config/dispatcher.yaml.
        self.popen = subprocess.Popen(
            args,
            cwd=directory if config is None else ROOT,
            env=child_env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.raw: list[str] = []
        self.lines: list[dict[str, Any]] = []
        self.malformed: list[str] = []
        self._cond = threading.Condition()
        if read:
            self.start_reading()

    def start_reading(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._cond:
                self.raw.append(line)
                if line.startswith("{"):
                    try:
                        self.lines.append(json.loads(line))
                    except ValueError:  # a broken log line is a finding, not a dead reader
                        self.malformed.append(line)
                self._cond.notify_all()

    def wait_for(self, event: str, timeout: float = 20, **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    if line.get("event") == event and all(
                        line.get(k) == v for k, v in fields.items()
                    ):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no {event!r} line {fields} within {timeout}s; "
                        f"{len(self.malformed)} malformed lines; output:\n"
                        + "".join(self.raw[-30:])
                    )
                self._cond.wait(min(left, 0.5))

    @property
    def port(self) -> int:
        return int(self.wait_for("listening")["port"])

    def get(self, path: str) -> tuple[int, str, str]:
        """(status, content type, body) of a GET on the ops listener."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.headers.get("content-type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("content-type", ""), e.read().decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Signal the service and wait for its exit code; one that does not exit in
        time is killed (never left running after the test) and the wait raises."""
        self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def output(self) -> str:
        with self._cond:
            return "".join(self.raw)
