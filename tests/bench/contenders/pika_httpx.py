"""Contender (a): pika BlockingConnection, a synchronous httpx.Client post, then ack.

As a user would write it: prefetch 50 but one message at a time, binary mode
(the message's ``ce-`` headers as HTTP headers, its content type, its body),
ack after a 2xx, nack with requeue otherwise. Runs until SIGTERM, then cancels
its consumer (unprocessed prefetched messages go back to the queue) and closes.

    python tests/bench/contenders/pika_httpx.py --url URL --queue Q --subscriber URL
"""

from __future__ import annotations

import argparse
import signal
from typing import Any

import httpx
import pika

stopping = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stopping  # noqa: PLW0603
    stopping = True


def http_headers(properties: Any) -> dict[str, str]:
    headers = {k: str(v) for k, v in (properties.headers or {}).items() if k.startswith("ce-")}
    if properties.content_type:
        headers["content-type"] = properties.content_type
    return headers


def deliver(client: httpx.Client, url: str, properties: Any, body: bytes) -> bool:
    try:
        return client.post(url, content=body, headers=http_headers(properties)).is_success
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--subscriber", required=True)
    parser.add_argument("--prefetch", type=int, default=50)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    client = httpx.Client(timeout=10.0)
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=args.prefetch)
    for method, properties, body in channel.consume(args.queue, inactivity_timeout=0.2):
        if stopping:
            break
        if method is None:
            continue
        if deliver(client, args.subscriber, properties, body):
            channel.basic_ack(method.delivery_tag)
        else:
            channel.basic_nack(method.delivery_tag, requeue=True)
    channel.cancel()
    connection.close()
    client.close()


if __name__ == "__main__":
    main()
