"""pika connections from ``BrokerSettings``: each node's parameters (URL,
heartbeat, TLS, name), which node to try next, and the teardown every
``SelectConnection`` owner needs.

``broker.url`` may name the nodes of one cluster. Every connection of ours
then goes through ``Rotation``: each connect tries the next node after the
one tried last (the first node at start-up), and the ``broker.reconnect``
backoff applies only once a whole round of nodes has failed. Losing an open
connection to node *i* leads straight to node *i+1*: the cluster's other
nodes hold the queues, so waiting for the lost one would only delay
consumption. With one node this is the single-URL behaviour it always was:
``wait(0)`` after losing an open connection, ``wait(n)`` after *n* failed
connects in a row.

A node is named by ``host:port`` in logs and metrics (``Node.label``), never by
its URL, which may hold a password.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorPhaseErrorBase,
)

from dispatcher.broker import amqp_properties
from dispatcher.config import BrokerSettings, redact_url
from dispatcher.credentials.tls import ReloadingContext, tls_context
from dispatcher.delivery.retry import Backoff
from dispatcher.observe.logs import get_logger

log = get_logger()

# A connect that takes longer than this is treated as failed and retried
# with backoff; without it a black-holed SYN would stall the supervisor.
CONNECT_TIMEOUT = 10.0


class Node:
    """One broker node: what to connect with, and its name for logs and metrics.
    With ``tls``, its parameters carry that context as it is now (``parameters``
    is read at each connect)."""

    __slots__ = ("_parameters", "_tls", "label")

    def __init__(
        self, label: str, parameters: pika.URLParameters, tls: ReloadingContext | None = None
    ) -> None:
        self.label = label  # host:port, never the password
        self._parameters = parameters
        self._tls = tls

    @property
    def parameters(self) -> pika.URLParameters:
        tls, parameters = self._tls, self._parameters
        if tls is not None and parameters.ssl_options is not None:
            context = tls.current()
            if parameters.ssl_options.context is not context:
                parameters.ssl_options = pika.SSLOptions(context, parameters.host)
        return parameters


def node_label(parameters: pika.ConnectionParameters) -> str:
    """``host:port`` (``[v6]:port``) of a node: what logs and metrics call it."""
    host = str(parameters.host)
    return f"[{host}]:{parameters.port}" if ":" in host else f"{host}:{parameters.port}"


def nodes(broker: BrokerSettings, role: str) -> tuple[Node, ...]:
    """Every node of ``broker.url``, in the order given, with its parameters."""
    tls = ReloadingContext(broker.tls) if broker.uses_tls else None
    built = []
    for url in broker.urls:
        parameters = connection_parameters(broker, role, url)
        built.append(Node(node_label(parameters), parameters, tls))
    return tuple(built)


def redacted_urls(broker: BrokerSettings) -> str:
    """Every node's URL with its password masked, for messages: ``a, b``."""
    return ", ".join(redact_url(url) for url in broker.urls)


def connection_parameters(
    broker: BrokerSettings, role: str, url: str | None = None
) -> pika.URLParameters:
    """The parameters for ``url``, one of ``broker.urls`` (None: the first node)."""
    # Every connection of ours reads content headers pika cannot decode as a
    # marker instead of dying on them: the service's consumer, the publisher's
    # returned messages, and archive draining a dead-letter queue, where such
    # messages end up (amqp_properties).
    amqp_properties.install()
    url = broker.urls[0] if url is None else url
    params = pika.URLParameters(url)
    params.heartbeat = round(broker.heartbeat)  # validated: 1 s to the AMQP limit
    params.blocked_connection_timeout = broker.blocked_timeout
    params.connection_attempts = 1
    params.socket_timeout = CONNECT_TIMEOUT
    params.stack_timeout = CONNECT_TIMEOUT * 1.5
    params.client_properties = {"connection_name": f"{broker.connection_name}-{role}"}
    if params.ssl_options is not None or url.lower().startswith("amqps://"):
        params.ssl_options = pika.SSLOptions(tls_context(broker.tls), params.host)
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


class Rotation:
    """Which node of ``broker.url`` to connect to next, and how long to wait first.

    A round is one try of every node. Tries go round the nodes in order, each
    starting after the node tried last, whatever became of it. The wait before
    the next try is zero until a round is complete; then it is ``backoff.wait(k)``
    with ``k`` the connects failed since the last connection that opened, over
    the number of nodes. A connection that served (its consumers, or its confirm
    channel, were set up) for at least the first reconnect delay and was then
    lost starts a new round, of which it is the first try: so the next node comes
    at once, and with one node the wait is ``wait(0)``. One lost sooner, or
    before it was put to use, only counts as a try of the round it is in: nodes
    that drop connections at once, used or not, still cost a backoff per round,
    never a busy loop (no node is connected to twice within that delay without
    a wait).
    """

    def __init__(self, nodes: Sequence[Node], backoff: Backoff) -> None:
        if not nodes:
            raise ValueError("a rotation needs at least one node")
        self.nodes = tuple(nodes)
        self.backoff = backoff
        self._cursor = 0  # the next node to try
        self._tried = 0  # tries in the current round
        self._failed = 0  # connects failed in a row since one last opened

    def next(self) -> Node:
        """The node to try now: the one after the node tried last (at first, the first)."""
        node = self.nodes[self._cursor]
        self._cursor = (self._cursor + 1) % len(self.nodes)
        return node

    def ended(self, *, opened: bool, served: float | None) -> float:
        """The connection to the node ``next`` gave is over: the seconds to wait before
        the next try (0: go on to the next node at once). ``opened``: it had opened
        (else the connect failed); ``served``: seconds since it was put to use, None
        if it never was."""
        if opened:
            self._failed = 0
            healthy = served is not None and served >= self.backoff.delay
            self._tried = 1 if healthy else self._tried + 1
        else:
            self._failed += 1
            self._tried += 1
        if self._tried < len(self.nodes):
            return 0.0  # the round goes on
        self._tried = 0
        return self.backoff.wait(self._failed // len(self.nodes))


def connect_blocking(candidates: Sequence[Node]) -> tuple[Any, Node]:
    """A ``pika.BlockingConnection`` to the first of ``candidates`` that answers, tried
    in order, and that node; raises the last node's ``AMQPConnectionError`` if none
    does. For the batch commands, which connect once. pika's blocking connection
    raises a TLS failure (a certificate that does not verify) as the ``ssl`` error
    itself: it is a node that failed like any other, wrapped the same way."""
    error: pika.exceptions.AMQPConnectionError | None = None
    for index, node in enumerate(candidates):
        try:
            return pika.BlockingConnection(node.parameters), node
        except (pika.exceptions.AMQPConnectionError, OSError) as e:
            error = e if isinstance(e, pika.exceptions.AMQPConnectionError) else None
            error = error or pika.exceptions.AMQPConnectionError(e)
            if index + 1 < len(candidates):
                log.warning(
                    "broker connect failed: trying the next node",
                    node=node.label,
                    error=describe_error(e),
                )
    assert error is not None, "no node to connect to"
    raise error


def describe_error(error: object) -> str:
    """A pika error for a log line: what went wrong, its kind and message, at most
    300 characters. pika wraps a failed connect two or three deep (a connection
    error around the workflow's failure around each attempt's, around the socket's
    or TLS's own error), with an empty message at every level: the innermost
    error says why (a certificate that does not verify, a refused connection)."""
    error = _innermost(error)
    return f"{type(error).__name__}: {str(error) or repr(error)}"[:300]


def _innermost(error: object) -> object:
    for _depth in range(8):  # a bound, whatever pika nests
        if isinstance(error, AMQPConnectionWorkflowFailed) and error.exceptions:
            error = error.exceptions[-1]  # the last attempt's: the last node tried
        elif isinstance(error, AMQPConnectorPhaseErrorBase):
            error = error.exception
        elif (
            isinstance(error, pika.exceptions.AMQPConnectionError)
            and len(error.args) == 1
            and isinstance(error.args[0], BaseException)
        ):
            error = error.args[0]
        else:
            break
    return error


def virtual_host(broker: BrokerSettings) -> str:
    """The virtual host of the first node (``dispatcher.resolve`` checks that every node
    names it), as pika reads it."""
    return str(pika.URLParameters(broker.urls[0]).virtual_host)
