"""Helpers for tests on the shared broker at 127.0.0.1:5672 (never stopped or reconfigured)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pika

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


def unique(prefix: str) -> str:
    return f"test-{prefix}-{uuid.uuid4().hex[:10]}"


@contextmanager
def channel(url: str = URL) -> Iterator[Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        yield connection.channel()
    finally:
        if connection.is_open:
            connection.close()


def publish(
    queue: str,
    body: bytes = b"{}",
    headers: dict[str, Any] | None = None,
    content_type: str | None = "application/json",
    message_id: str | None = None,
    exchange: str = "",
    url: str = URL,
) -> None:
    with channel(url) as ch:
        ch.confirm_delivery()
        ch.basic_publish(
            exchange,
            queue,
            body,
            pika.BasicProperties(
                headers=headers,
                content_type=content_type,
                message_id=message_id,
                delivery_mode=2,
            ),
            mandatory=True,
        )


def event_headers(event_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "ce-specversion": "1.0",
        "ce-id": event_id,
        "ce-source": "/tests",
        "ce-type": "dev.tests.event",
        **extra,
    }


def publish_events(queue: str, ids: list[str], url: str = URL) -> None:
    with channel(url) as ch:
        ch.confirm_delivery()
        for event_id in ids:
            ch.basic_publish(
                "",
                queue,
                b'{"n": 1}',
                pika.BasicProperties(
                    headers=event_headers(event_id),
                    content_type="application/json",
                    delivery_mode=2,
                ),
                mandatory=True,
            )


def queue_depth(queue: str, url: str = URL) -> int:
    """Ready messages (not counting unacked ones)."""
    with channel(url) as ch:
        return int(ch.queue_declare(queue, passive=True).method.message_count)


def get_all(queue: str, url: str = URL) -> list[tuple[Any, bytes]]:
    """Drain ready messages with basic_get; returns (properties, body) pairs."""
    found = []
    with channel(url) as ch:
        while True:
            method, props, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.append((props, body))


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 10.0,
    message: str = "condition",
    interval: float = 0.05,
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def delete(queues: list[str] = (), exchanges: list[str] = (), url: str = URL) -> None:  # type: ignore[assignment]
    with channel(url) as ch:
        for q in queues:
            ch.queue_delete(q)
        for x in exchanges:
            ch.exchange_delete(x)


def declare_fanout_with_queue(url: str = URL, prefix: str = "x") -> tuple[str, str]:
    """A fresh fanout exchange and a queue bound to it: (exchange, queue)."""
    exchange, queue = unique(prefix), unique(f"{prefix}q")
    with channel(url) as ch:
        ch.exchange_declare(exchange, "fanout")
        ch.queue_declare(queue)
        ch.queue_bind(queue, exchange)
    return exchange, queue
