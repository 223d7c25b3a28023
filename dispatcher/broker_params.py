"""pika connections from ``BrokerSettings``: parameters (URL, heartbeat, TLS, name),
and the teardown every ``SelectConnection`` owner needs."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pika

from dispatcher import amqp_properties
from dispatcher.config import BrokerSettings
from dispatcher.retry import Backoff

# A connect that takes longer than this is treated as failed and retried
# with backoff; without it a black-holed SYN would stall the supervisor.
CONNECT_TIMEOUT = 10.0


def connection_parameters(broker: BrokerSettings, role: str) -> pika.URLParameters:
    # Every connection of ours reads content headers pika cannot decode as a
    # marker instead of dying on them: the service's consumer, the publisher's
    # returned messages, and archive draining a dead-letter queue, where such
    # messages end up (amqp_properties).
    amqp_properties.install()
    params = pika.URLParameters(broker.url)
    params.heartbeat = round(broker.heartbeat)  # validated: 1 s to the AMQP limit
    params.blocked_connection_timeout = broker.blocked_timeout
    params.connection_attempts = 1
    params.socket_timeout = CONNECT_TIMEOUT
    params.stack_timeout = CONNECT_TIMEOUT * 1.5
    params.client_properties = {"connection_name": f"{broker.connection_name}-{role}"}
    if params.ssl_options is not None or broker.url.startswith("amqps://"):
        params.ssl_options = pika.SSLOptions(broker.tls.context(), params.host)
    return params


# Connects of many dispatchers after one outage must not arrive in lock-step.
RECONNECT_JITTER = 0.5


def reconnect_backoff(broker: BrokerSettings, rng: Callable[[], float] = random.random) -> Backoff:
    """``broker.reconnect`` as the wait before each new connection, for every
    connection of the service (the consumer's and the publisher's)."""
    return Backoff(
        "exponential",
        broker.reconnect.initial_delay,
        broker.reconnect.max_delay,
        rng=rng,
        jitter=RECONNECT_JITTER,
    )


def virtual_host(broker: BrokerSettings) -> str:
    vhost: Any = pika.URLParameters(broker.url).virtual_host
    return str(vhost)


def release(connection: Any, bound: float = 5.0) -> None:
    """After a ``SelectConnection``'s loop has returned: close it if it is still open
    (an exception ended the loop, not a close), waiting at most ``bound`` seconds,
    then free the loop's poller and wake-up pipe. Never raises."""
    try:
        if not connection.is_closed:
            connection.ioloop.call_later(bound, connection.ioloop.stop)
            connection.close()
            connection.ioloop.start()  # until the close completes (its callback stops it)
    except Exception:  # a connection that cannot even close is dropped with its loop
        pass
    finally:
        connection.ioloop.close()
