"""A demo CloudEvents subscriber for ``make run``: prints every event it receives.

Standard library only. Answers 202 to every POST and prints one line per
event, flushed at once, so the events show up in the ``make run`` terminal.
Understands binary mode (``ce-*`` HTTP headers) and structured mode (a JSON
body with content type ``application/cloudevents...``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

DATA_PREVIEW = 200


def _describe(headers: dict[str, str], body: bytes) -> str:
    content_type = headers.get("content-type", "")
    attrs: dict[str, Any]
    if content_type.lower().startswith("application/cloudevents"):
        try:
            event = json.loads(body)
        except ValueError:
            return f"unparsable structured event: {body[:DATA_PREVIEW]!r}"
        if not isinstance(event, dict):
            return f"structured event is not a JSON object: {body[:DATA_PREVIEW]!r}"
        attrs = event
        if "data_base64" in event:
            data = f"<base64> {event['data_base64']}"
        elif isinstance(event.get("data"), str):
            data = event["data"]
        else:
            data = json.dumps(event.get("data"), separators=(",", ":"))
    else:
        attrs = {k[3:]: v for k, v in headers.items() if k.startswith("ce-")}
        data = body.decode("utf-8", errors="replace")
    return (
        f"id={attrs.get('id')} type={attrs.get('type')} source={attrs.get('source')} "
        f"data={data[:DATA_PREVIEW]}"
    )


class Handler(BaseHTTPRequestHandler):
    server_version = "demo-subscriber"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        print(f"demo-subscriber: received {_describe(headers, body)}", flush=True)
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        # Quiet: one line per event is printed by do_POST, no access log.
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="A demo CloudEvents subscriber for make run: prints every event it receives."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on")
    args = parser.parse_args(argv)

    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        print(f"demo-subscriber: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    server.daemon_threads = True

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # A shell starts background jobs with SIGINT ignored: keep it so, so that under
    # `make run` Ctrl-C stops the service first and this server stays up for its
    # in-flight deliveries until make's trap sends SIGTERM.
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    thread = threading.Thread(target=server.serve_forever, name="demo-subscriber", daemon=True)
    thread.start()
    print(f"demo-subscriber: listening on http://{args.host}:{args.port}/", flush=True)
    while not stop.wait(0.5):
        if not thread.is_alive():
            break
    server.shutdown()
    server.server_close()
    print("demo-subscriber: stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
