"""Cluster URLs (issue 13, item 3): ``broker.url`` lists two disposable nodes.

The two nodes are not clustered with each other: the test queue is declared
on each, and each event is published to the node that is up. What is shown
is the client's side of a failover: the first URL's node down at start, so
the service connects to the second; the connected node stopped, so it goes
straight to the other (the stopped one stays down) and consumes there; and
``dispatcher_broker_node`` and the logs name the node by host:port, never
with the password.

The batch commands take the same list: replay's exchange check goes on to
the next node when the first is down (archive's test is in
tests/integration/test_archive.py).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import generate_latest

from dispatcher.config import BrokerSettings
from dispatcher.errors import BatchInputError
from dispatcher.pipeline.replay import check_exchange
from tests.support import broker
from tests.support.broker import event_headers, publish, wait_until
from tests.support.node import RabbitNode, free_port

USER, PASSWORD = "failover", "Pw-not-for-logs-7731"
ARGUMENTS = {"x-queue-type": "classic"}  # as run_service's binding declares it


def url(node: RabbitNode) -> str:
    return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{node.port}/%2F"


def label(node: RabbitNode) -> str:
    return f"127.0.0.1:{node.port}"


@pytest.fixture(scope="module")
def pair() -> Iterator[list[RabbitNode]]:
    """Two disposable nodes, started together, each with a user whose password is checked
    never to be shown."""
    nodes = [RabbitNode(), RabbitNode()]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(RabbitNode.start, nodes))
        for node in nodes:
            node.ctl("add_user", USER, PASSWORD)
            node.ctl("set_permissions", "-p", "/", USER, ".*", ".*", ".*")
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


def node_gauge(svc: Any) -> dict[str, float]:
    """``dispatcher_broker_node`` as it is exposed: node label -> value."""
    return {
        sample.labels["node"]: sample.value
        for family in svc.metrics.registry.collect()
        if family.name == "dispatcher_broker_node"
        for sample in family.samples
    }


def log_lines(captured: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in captured.splitlines() if line.startswith("{")]


def connects(lines: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    """(event, node, retry_in_s) of the consumer's connection lines, in order."""
    events = ("broker connected", "broker connect failed", "broker disconnected")
    return [
        (line["event"], line["node"], line.get("retry_in_s"))
        for line in lines
        if line.get("event") in events
    ]


@pytest.mark.fault
@pytest.mark.timeout(240)
def test_consumption_follows_the_cluster_to_whichever_node_is_up(
    pair: list[RabbitNode], make_subscriber, run_service, capsys
):
    first, second = pair
    queue = broker.unique("cluster")
    for node in pair:
        with broker.channel(node.url) as ch:
            ch.queue_declare(queue, durable=True, arguments=ARGUMENTS)
    first.stop_app()  # the first URL's node is down at start

    sub = make_subscriber()
    svc = run_service(
        sub.url,
        queue=queue,
        url=second.url,  # where the fixture cleans up
        broker_settings={"url": [url(first), url(second)]},
    )
    assert node_gauge(svc) == {label(second): 1.0}
    assert svc.value("dispatcher_broker_connected") == 1
    publish(queue, headers=event_headers("on-second"), url=second.url)
    svc.wait_events("delivered", 1)

    first.start_app()
    second.stop_app()  # the connected node goes, and stays down
    wait_until(lambda: node_gauge(svc).get(label(first)) == 1.0, 30, "a connection to the first")
    wait_until(svc.service.ready, 30, "a consumer on the first node")
    publish(queue, headers=event_headers("on-first"), url=first.url)
    svc.wait_events("delivered", 2)

    assert sub.ids() == ["on-second", "on-first"]
    assert node_gauge(svc) == {label(first): 1.0, label(second): 0.0}
    assert first.consumers(queue) == 1
    with pytest.raises(ConnectionRefusedError):  # still down: nothing waited for it
        socket.create_connection(("127.0.0.1", second.port), timeout=5).close()

    lines = log_lines(capsys.readouterr().out)
    seen = connects(lines)
    # Start: the first node refuses, the second is tried at once and connects.
    assert seen[:3] == [
        ("broker connect failed", label(first), None),
        ("broker disconnected", label(first), 0.0),
        ("broker connected", label(second), None),
    ], seen
    # Stopping the second: straight on to the first (no wait), where it ends up
    # connected. (A first node still warming up may refuse once: that is a retry
    # the rotation is right to make, so only the first step and the end are fixed.)
    assert seen[3] == ("broker disconnected", label(second), 0.0), seen
    assert seen[4][:2] in {
        ("broker connected", label(first)),
        ("broker connect failed", label(first)),
    }
    assert seen[-1] == ("broker connected", label(first), None), seen
    exposed = generate_latest(svc.metrics.registry).decode()
    every_node = {line["node"] for line in lines if "node" in line}
    every_node |= set(re.findall(r'dispatcher_broker_node\{node="([^"]*)"\}', exposed))
    assert every_node == {label(first), label(second)}
    shown = json.dumps(lines) + exposed
    assert PASSWORD not in shown


@pytest.mark.broker
def test_replay_checks_the_exchange_on_the_next_node_when_the_first_is_down():
    dead = f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}/%2F"
    check_exchange(BrokerSettings(url=(dead, broker.URL)), "amq.direct")  # no error

    also_dead = f"amqp://guest:{PASSWORD}@127.0.0.1:{free_port()}/%2F"
    with pytest.raises(BatchInputError) as caught:
        check_exchange(BrokerSettings(url=(dead, also_dead)), "amq.direct")
    message = str(caught.value)
    assert message.startswith("cannot connect to the broker at amqp://guest:***@127.0.0.1:")
    assert message.count("guest:***@127.0.0.1:") == 2, message
    assert PASSWORD not in message
