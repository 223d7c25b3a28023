"""Ceiling: one httpx.Client shared by N threads against the subscriber, no broker.

How a thread-pool consumer built on httpx would post: ``--concurrency`` threads
share one ``httpx.Client`` whose pool keeps that many connections alive, and
post the events listed in ``--ids`` in binary mode, each once (retried up to 5
times on a non-2xx or an error). Then it waits for SIGTERM, so the bench can
read its CPU time.

    python tests/bench/contenders/http_httpx_threads.py --subscriber URL --concurrency N --ids F
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.bench import payload

ATTEMPTS = 5


def post(client: httpx.Client, url: str, event_id: str) -> None:
    for _ in range(ATTEMPTS):
        try:
            headers = payload.http_headers(event_id)
            if client.post(url, content=payload.BODY, headers=headers).is_success:
                return
        except httpx.HTTPError:
            pass


def worker(client: httpx.Client, url: str, ids: Iterator[str], lock: threading.Lock) -> None:
    while True:
        with lock:
            event_id = next(ids, None)
        if event_id is None:
            return
        post(client, url, event_id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscriber", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--ids", required=True)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    ids, lock = iter(Path(args.ids).read_text().split()), threading.Lock()
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    with httpx.Client(timeout=10.0, limits=limits) as client:
        threads = [
            threading.Thread(target=worker, args=(client, args.subscriber, ids, lock))
            for _ in range(args.concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stop.wait()


if __name__ == "__main__":
    main()
