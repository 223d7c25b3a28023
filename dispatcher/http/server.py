"""The operations listener: ``/metrics``, ``/healthz`` and ``/readyz`` on ``http.listen``.

Served by the standard library on a thread of its own, never by pika's or a
worker's. ``prometheus_client.start_http_server`` would answer every path with
metrics, so the three paths are routed here and anything else is a 404.

- ``/healthz``: 200 while the process and its broker I/O loop are alive. The
  broker thread ticks every second, connected or not (its reconnect wait
  ticks too); a tick older than ``STUCK_AFTER`` means the loop is stuck, and
  Kubernetes should restart the pod: 503.
- ``/readyz``: 200 only while every binding has a live consumer; otherwise 503
  with ``{"ready": false, "down": [bindings...]}``. 503 during shutdown.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dispatcher.logs import get_logger

log = get_logger()

STUCK_AFTER = 10.0  # seconds without a broker-loop tick before /healthz says 503


class OpsServer:
    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        last_tick: Callable[[], float],
        consumers: Callable[[], dict[str, bool]],
        stopping: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._last_tick = last_tick
        self._consumers = consumers
        self._stopping = stopping
        self._clock = clock
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._started = False
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="ops-http",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        self._started = True
        log.info("listening", port=self.port, paths=["/metrics", "/healthz", "/readyz"])

    def close(self) -> None:
        # shutdown() waits for serve_forever to return: never call it if it never ran.
        if self._started:
            self._server.shutdown()
        self._server.server_close()

    # ----------------------------------------------------------------- answers

    def healthz(self) -> tuple[int, dict[str, object]]:
        age = self._clock() - self._last_tick()
        if age > STUCK_AFTER:
            return 503, {"alive": False, "broker_loop_stalled_s": round(age, 1)}
        return 200, {"alive": True}

    def readyz(self) -> tuple[int, dict[str, object]]:
        if self._stopping():
            return 503, {"ready": False, "reason": "shutting down"}
        down = sorted(name for name, up in self._consumers().items() if not up)
        if down:
            return 503, {"ready": False, "down": down}
        return 200, {"ready": True}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "dispatcher"
            sys_version = ""
            # A client that connects and sends nothing must not hold a thread forever.
            timeout = 10.0

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the delivery log

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(owner._registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    status, body = owner.healthz() if path == "/healthz" else owner.readyz()
                    self._send(status, json.dumps(body).encode(), "application/json")
                else:
                    self._send(404, b'{"error": "not found"}', "application/json")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler
