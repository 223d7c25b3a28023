"""Ceiling: pika consuming with auto-ack and no HTTP at all.

How fast one Python process can take messages off the queue through pika's
BlockingConnection, which bounds any pika-based consumer. It is its own
subscriber: each delivery is recorded in a receipt log (``<epoch> <ce-id>
<ce-benchpublished or ->``, buffered, flushed whenever the queue goes quiet
for 50 ms), so the bench checks its ids like everyone else's. Runs until
SIGTERM.

    python tests/bench/contenders/pika_autoack.py --url URL --queue Q --log PATH
"""

from __future__ import annotations

import argparse
import signal
import time

import pika

stopping = False


def on_sigterm(_signum: int, _frame: object) -> None:
    global stopping  # noqa: PLW0603
    stopping = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--prefetch", type=int, default=1000)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_sigterm)
    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=args.prefetch)  # no effect with auto-ack; explicit anyway
    with open(args.log, "a", buffering=8192) as log:  # a write every ~150 events
        deliveries = channel.consume(args.queue, auto_ack=True, inactivity_timeout=0.05)
        for method, properties, _body in deliveries:
            if stopping:
                break
            if method is None:
                log.flush()
                continue
            headers = properties.headers or {}
            published = headers.get("ce-benchpublished", "-")
            log.write(f"{time.time():.6f} {headers.get('ce-id', '-')} {published}\n")
    channel.cancel()
    connection.close()


if __name__ == "__main__":
    main()
