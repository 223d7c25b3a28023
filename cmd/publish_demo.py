"""Publish demo CloudEvents to a RabbitMQ queue: ``make publish``.

Binary content mode: the CloudEvent attributes travel as ``ce-*`` AMQP headers,
the JSON data is the body. Publishes to the default exchange with the queue
name as routing key, persistent, with publisher confirms, over one connection.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions

DEFAULT_URL = "amqp://guest:guest@localhost:5672/%2F"
SOURCE = "/demo/publisher"
TYPE = "dev.dispatcher.demo"


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Publish demo CloudEvents to a RabbitMQ queue: make publish."
    )
    parser.add_argument("--queue", default="demo", help="target queue (default: demo)")
    parser.add_argument(
        "--url",
        default=os.environ.get("RABBITMQ_URL") or DEFAULT_URL,
        help=f"broker URL (default: $RABBITMQ_URL, else {DEFAULT_URL})".replace("%", "%%"),
    )
    parser.add_argument("--count", type=int, default=1, help="number of events (default: 1)")
    parser.add_argument("--data", default='{"hello": "world"}', help="event data, a JSON document")
    args = parser.parse_args(argv)

    if args.count < 1:
        parser.error("--count must be >= 1")
    try:
        json.loads(args.data)
    except ValueError as e:
        parser.error(f"--data is not valid JSON: {e}")
    body = args.data.encode("utf-8")

    try:
        params = pika.URLParameters(args.url)
    except Exception as e:
        print(f"publish-demo: bad --url {_redact(args.url)}: {e}", file=sys.stderr)
        return 2
    params.client_properties = {"connection_name": "dispatcher-publish-demo"}

    try:
        connection = pika.BlockingConnection(params)
    except pika.exceptions.AMQPError as e:
        print(
            f"publish-demo: cannot connect to {_redact(args.url)}: {e!r}",
            file=sys.stderr,
        )
        return 1
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for _ in range(args.count):
            event_id = str(uuid.uuid4())
            properties = pika.BasicProperties(
                content_type="application/json",
                delivery_mode=pika.DeliveryMode.Persistent,
                headers={
                    "ce-specversion": "1.0",
                    "ce-id": event_id,
                    "ce-source": SOURCE,
                    "ce-type": TYPE,
                    "ce-time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                },
            )
            # mandatory: an unroutable message (no such queue) is returned, not dropped.
            channel.basic_publish(
                exchange="",
                routing_key=args.queue,
                body=body,
                properties=properties,
                mandatory=True,
            )
            print(
                f"publish-demo: published id={event_id} type={TYPE} source={SOURCE} "
                f"to queue={args.queue} data={args.data}",
                flush=True,
            )
    except pika.exceptions.UnroutableError:
        print(
            f"publish-demo: queue {args.queue!r} does not exist on {_redact(args.url)}"
            " (is `make run` running? it declares the demo queue)",
            file=sys.stderr,
        )
        return 1
    except pika.exceptions.NackError:
        print("publish-demo: the broker refused the message (nack)", file=sys.stderr)
        return 1
    except pika.exceptions.AMQPError as e:
        print(f"publish-demo: publishing failed: {e!r}", file=sys.stderr)
        return 1
    finally:
        if connection.is_open:
            connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
