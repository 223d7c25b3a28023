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
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


class DispatcherProcess:
    def __init__(
        self,
        config: dict[str, Any] | None,
        directory: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        args = [sys.executable, "-m", "dispatcher", "run"]
        if config is not None:
            path = directory / "dispatcher.yaml"
            path.write_text(yaml.safe_dump(config))
            args += ["--config", str(path)]
        environ = {k: v for k, v in os.environ.items() if k != "DISPATCHER_CONFIG"}
        # Without --config, run from a folder with no config/dispatcher.yaml.
        self.popen = subprocess.Popen(
            args,
            cwd=directory if config is None else ROOT,
            env={**environ, "PYTHONPATH": str(ROOT), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.raw: list[str] = []
        self.lines: list[dict[str, Any]] = []
        self.malformed: list[str] = []
        self._cond = threading.Condition()
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
        self.popen.send_signal(sig)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def output(self) -> str:
        with self._cond:
            return "".join(self.raw)
