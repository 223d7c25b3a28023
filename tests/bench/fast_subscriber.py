"""A cheap asyncio HTTP subscriber for benchmarks: answers 202, optionally after a delay.

    python tests/bench/fast_subscriber.py [PORT] [--delay SECONDS] [--status N] [--log PATH]

Prints its port on stdout. It must not be the bottleneck it is measuring
against, so it is a bare ``asyncio.Protocol``: no coroutine, no StreamReader,
three regular expressions per request head, keep-alive with Content-Length
bodies. Each POST is answered ``--delay`` seconds after its head arrived (a
``call_later``; W3's slow subscriber) and, with ``--log``, recorded as one line
``<arrival epoch> <ce-id> <ce-benchpublished or ->`` through a buffer flushed
every 50 ms. ``--status 400`` answers every POST with that status instead (W7's
dead-letter storm). ``GET /stats`` returns ``received duplicates``. SIGUSR1
takes it down (every POST answered 503 at once and not recorded: W8's outage),
SIGUSR2 brings it back.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import time
from typing import IO


def response(status: int) -> bytes:
    return b"HTTP/1.1 %d X\r\ncontent-length: 0\r\n\r\n" % status


FLUSH_EVERY = 0.05
LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)", re.I | re.M)
EVENT_ID = re.compile(rb"^ce-id:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.I | re.M)
PUBLISHED = re.compile(rb"^ce-benchpublished:[ \t]*([^\r\n]*?)[ \t]*\r?$", re.I | re.M)


class Stats:
    def __init__(self, log: IO[str] | None) -> None:
        self.ids: set[bytes] = set()
        self.received = 0
        self.duplicates = 0
        self.log = log

    def record(self, arrived: float, head: bytes) -> None:
        event_id = EVENT_ID.search(head)
        key = event_id.group(1) if event_id else b"-"
        self.received += 1
        if key in self.ids:
            self.duplicates += 1
        self.ids.add(key)
        if self.log is not None:
            published = PUBLISHED.search(head)
            stamp = published.group(1).decode() if published else "-"
            self.log.write(f"{arrived:.6f} {key.decode()} {stamp}\n")


DOWN: list[bool] = [False]  # SIGUSR1 / SIGUSR2
UNAVAILABLE = response(503)


class Subscriber(asyncio.Protocol):
    def __init__(self, stats: Stats, delay: float, answer: bytes) -> None:
        self.stats = stats
        self.delay = delay
        self.answer = answer
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        arrived = time.time()
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end]
            length = LENGTH.search(head)
            total = end + 4 + (int(length.group(1)) if length else 0)
            if len(self.buffer) < total:
                return
            self.buffer = self.buffer[total:]
            self.request(arrived, head)

    def request(self, arrived: float, head: bytes) -> None:
        if head.startswith(b"GET /stats"):
            body = f"{self.stats.received} {self.stats.duplicates}".encode()
            self.send(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            return
        if DOWN[0]:
            self.send(UNAVAILABLE)
            return
        self.stats.record(arrived, head)
        if self.delay:
            self.loop.call_later(self.delay, self.send, self.answer)
        else:
            self.send(self.answer)

    def send(self, response: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)


def flush_periodically(loop: asyncio.AbstractEventLoop, log: IO[str]) -> None:
    log.flush()
    loop.call_later(FLUSH_EVERY, flush_periodically, loop, log)


async def main(port: int, delay: float, status: int, log: IO[str] | None) -> None:
    stats = Stats(log)
    loop = asyncio.get_running_loop()
    answer = response(status)
    # W6 opens 2,000 connections at once: a short backlog would drop SYNs (1 s retries).
    server = await loop.create_server(
        lambda: Subscriber(stats, delay, answer), "127.0.0.1", port, backlog=4096
    )
    loop.add_signal_handler(signal.SIGUSR1, DOWN.__setitem__, 0, True)
    loop.add_signal_handler(signal.SIGUSR2, DOWN.__setitem__, 0, False)
    print(server.sockets[0].getsockname()[1], flush=True)
    if log is not None:
        flush_periodically(loop, log)
    async with server:
        await server.serve_forever()


def interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: leave through the same path, so the log is flushed


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int, nargs="?", default=0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--status", type=int, default=202)
    parser.add_argument("--log")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupt)
    log_file = open(args.log, "a", buffering=1 << 16) if args.log else None  # noqa: SIM115
    try:
        asyncio.run(main(args.port, args.delay, args.status, log_file))
    except KeyboardInterrupt:
        pass
    finally:
        if log_file:
            log_file.close()
