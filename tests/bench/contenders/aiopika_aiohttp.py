"""Contender (b): aio-pika consumer, one asyncio task per message, an aiohttp session.

The fastest plain-Python design we know of: prefetch = parallelism, aio-pika
runs each delivery in a task of its own, one ``aiohttp.ClientSession`` whose
connector allows ``parallelism`` connections; binary mode (``ce-`` headers,
content type, body); ack after a 2xx, nack with requeue otherwise. On SIGTERM
it cancels its consumer, lets the tasks in flight finish, and closes.

    python tests/bench/contenders/aiopika_aiohttp.py --url URL --queue Q \
        --subscriber URL --parallelism N
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aio_pika
import aiohttp
from aio_pika.abc import AbstractIncomingMessage


def http_headers(message: AbstractIncomingMessage) -> dict[str, str]:
    headers = {k: str(v) for k, v in message.headers.items() if k.startswith("ce-")}
    if message.content_type:
        headers["content-type"] = message.content_type
    return headers


class Consumer:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def deliver(self, message: AbstractIncomingMessage) -> bool:
        try:
            async with self.session.post(
                self.url, data=message.body, headers=http_headers(message)
            ) as response:
                await response.read()
                return 200 <= response.status < 300
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def on_message(self, message: AbstractIncomingMessage) -> None:
        self.in_flight += 1
        self.idle.clear()
        try:
            if await self.deliver(message):
                await message.ack()
            else:
                await message.nack(requeue=True)
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    connection = await aio_pika.connect(args.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=args.parallelism)
    queue = await channel.get_queue(args.queue, ensure=True)
    connector = aiohttp.TCPConnector(limit=args.parallelism)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        consumer = Consumer(session, args.subscriber)
        tag = await queue.consume(consumer.on_message)
        await stop.wait()
        await queue.cancel(tag)
        await consumer.idle.wait()
    await connection.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscriber", required=True)
    parser.add_argument("--parallelism", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
