"""Ceiling: the aiohttp client alone against the subscriber, no broker.

``--concurrency`` tasks share one ``ClientSession`` (connector limit =
concurrency) and post the events listed in ``--ids`` (one id a line) in binary
mode, each once; any non-2xx or error is retried, up to 5 times. Then it
waits for SIGTERM, so the bench can read its CPU time.

    python tests/bench/contenders/http_aiohttp.py --subscriber URL --concurrency N --ids FILE
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from tests.bench import payload

ATTEMPTS = 5


async def post(session: aiohttp.ClientSession, url: str, event_id: str) -> None:
    for _ in range(ATTEMPTS):
        try:
            headers = payload.http_headers(event_id)
            async with session.post(url, data=payload.BODY, headers=headers) as response:
                await response.read()
                if 200 <= response.status < 300:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass


async def worker(session: aiohttp.ClientSession, url: str, ids: Iterator[str]) -> None:
    for event_id in ids:  # one shared iterator: each id goes to exactly one worker
        await post(session, url, event_id)


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ids = iter(Path(args.ids).read_text().split())
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(
            *(worker(session, args.subscriber, ids) for _ in range(args.concurrency))
        )
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--subscriber", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--ids", required=True)
    asyncio.run(main(parser.parse_args()))
