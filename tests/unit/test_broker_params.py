from __future__ import annotations

import pika
import pytest

from dispatcher.broker.params import (
    Node,
    Rotation,
    connection_parameters,
    describe_error,
    nodes,
    reconnect_backoff,
    redacted_urls,
    virtual_host,
)
from dispatcher.broker.pika_loop import LoopConnection
from dispatcher.broker.publisher import Publisher
from dispatcher.config import BrokerSettings, ReconnectSettings, load_settings
from dispatcher.delivery.retry import Backoff
from dispatcher.loop import Loop
from tests.support.node import free_port


def test_parameters_from_settings():
    params = connection_parameters(
        BrokerSettings(url="amqp://u:p@h:5673/v%2Fx", heartbeat=20.0, blocked_timeout=45.0),
        "consumer",
    )
    assert (params.host, params.port, params.virtual_host) == ("h", 5673, "v/x")
    assert params.heartbeat == 20
    assert params.blocked_connection_timeout == 45.0
    assert params.connection_attempts == 1
    assert params.client_properties == {"connection_name": "dispatcher-consumer"}
    assert params.ssl_options is None


def test_amqps_gets_tls_and_the_heartbeat_beats_a_url_query():
    params = connection_parameters(
        BrokerSettings(url="amqps://u:p@broker.example:5671/%2F?heartbeat=0", heartbeat=7.0),
        "publisher",
    )
    assert params.heartbeat == 7
    assert params.ssl_options is not None
    assert params.ssl_options.server_hostname == "broker.example"


def test_virtual_host():
    assert virtual_host(BrokerSettings(url="amqp://g:g@localhost:5672/%2F")) == "/"


def test_every_connection_waits_as_broker_reconnect_says():
    """The publisher hard-coded 0.2 s to 10 s; broker.reconnect covers every connection."""
    broker = BrokerSettings(reconnect=ReconnectSettings(initial_delay=1.0, max_delay=4.0))
    backoff = reconnect_backoff(broker, rng=lambda: 0.5)  # the jitter's midpoint
    assert [backoff.wait(n) for n in range(4)] == [1.0, 2.0, 4.0, 4.0]
    loop = Loop()
    try:
        publisher = Publisher(broker, loop)  # connects only once started
        used = publisher._rotation.backoff
        assert used == reconnect_backoff(broker, used.rng)
    finally:
        loop.close()


# --------------------------------------------------------------------- a cluster's nodes

CLUSTER = BrokerSettings(
    url=(
        "amqp://u:s3cret@rabbit-0:5672/v",
        "amqps://u:s3cret@rabbit-1/v",
        "amqp://u:s3cret@[fd00::2]:5673/v",
    ),
    connection_name="disp",
)


def midpoint_backoff() -> Backoff:
    """1 s, 2 s, 4 s, 8 s (cap): the jitter's midpoint, so waits are exact."""
    return reconnect_backoff(
        BrokerSettings(reconnect=ReconnectSettings(initial_delay=1.0, max_delay=8.0)),
        rng=lambda: 0.5,
    )


def rotation(count: int) -> Rotation:
    fake = [Node(f"n{i}:5672", connection_parameters(BrokerSettings(), "t")) for i in range(count)]
    return Rotation(fake, midpoint_backoff())


def test_every_node_gets_its_own_parameters_and_a_label_without_password():
    built = nodes(CLUSTER, "consumer")
    assert [n.label for n in built] == ["rabbit-0:5672", "rabbit-1:5671", "[fd00::2]:5673"]
    assert [n.parameters.host for n in built] == ["rabbit-0", "rabbit-1", "fd00::2"]
    assert all(n.parameters.virtual_host == "v" for n in built)
    assert all(n.parameters.credentials.password == "s3cret" for n in built)
    assert all(
        n.parameters.client_properties == {"connection_name": "disp-consumer"} for n in built
    )
    assert all(
        n.parameters.heartbeat == 20 and n.parameters.connection_attempts == 1 for n in built
    )
    # TLS where the URL says amqps, checked against that node's own name.
    assert built[0].parameters.ssl_options is None and built[2].parameters.ssl_options is None
    assert built[1].parameters.ssl_options.server_hostname == "rabbit-1"


def test_messages_show_every_url_with_its_password_masked():
    shown = redacted_urls(CLUSTER)
    assert shown == (
        "amqp://u:***@rabbit-0:5672/v, amqps://u:***@rabbit-1/v, amqp://u:***@[fd00::2]:5673/v"
    )
    assert "s3cret" not in shown
    assert redacted_urls(BrokerSettings(url="amqp://g:pw@h/%2F")) == "amqp://g:***@h/%2F"


def test_the_virtual_host_is_the_first_nodes():
    broker = BrokerSettings(url=("amqp://g:g@a/first", "amqp://g:g@b/first"))
    assert virtual_host(broker) == "first"
    assert connection_parameters(broker, "x").host == "a"  # no url: the first node


def old_single_url_waits(outcomes: list[bool], backoff: Backoff) -> list[float]:
    """The supervisor's and publisher's waits before clusters (one URL)."""
    failures, waits = 0, []
    for opened in outcomes:
        failures = 0 if opened else failures + 1
        waits.append(backoff.wait(failures))
    return waits


SERVED = 60.0  # seconds a connection served before it was lost: a healthy one


def test_one_node_waits_exactly_as_before():
    """wait(0) after losing an open connection (used or not), wait(n) after n failed connects."""
    outcomes = [False, False, False, True, False, True, True, False, False, False, False, False]
    for used in (True, False):
        one = rotation(1)
        waits = []
        for opened in outcomes:
            assert one.next() is one.nodes[0]
            waits.append(one.ended(opened=opened, served=SERVED if used and opened else None))
        assert waits == old_single_url_waits(outcomes, midpoint_backoff())
        assert waits[:4] == [2.0, 4.0, 8.0, 1.0]  # and the backoff really grows


def test_nodes_are_tried_in_turn_and_only_a_whole_failed_round_waits():
    three = rotation(3)
    tried, waits = [], []
    for _ in range(7):  # nothing answers
        tried.append(three.next().label)
        waits.append(three.ended(opened=False, served=None))
    assert tried == ["n0:5672", "n1:5672", "n2:5672", "n0:5672", "n1:5672", "n2:5672", "n0:5672"]
    assert waits == [0.0, 0.0, 2.0, 0.0, 0.0, 4.0, 0.0]


def test_losing_a_connection_in_use_goes_straight_to_the_next_node():
    two = rotation(2)
    assert two.next().label == "n0:5672"
    assert two.ended(opened=False, served=None) == 0.0  # n0 down at start: on to n1
    assert two.next().label == "n1:5672"
    assert two.ended(opened=True, served=SERVED) == 0.0  # n1 served, then died: n0 at once
    assert two.next().label == "n0:5672"
    assert two.ended(opened=True, served=SERVED) == 0.0  # n0 served, then died: n1 at once
    assert two.next().label == "n1:5672"
    # n1 does not answer: the round that began with losing n0 is over, the backoff
    # starts from its first step, as one node's wait(0) after a loss.
    assert two.ended(opened=False, served=None) == 1.0
    assert two.next().label == "n0:5672"
    assert two.ended(opened=False, served=None) == 0.0
    assert two.next().label == "n1:5672"
    assert two.ended(opened=False, served=None) == 2.0


def test_connections_lost_soon_after_use_still_cost_a_wait_per_round():
    # Served, but for less than the first reconnect delay (1 s here): a node that
    # drops what it just accepted must not turn the rotation into a busy loop.
    two = rotation(2)
    waits = []
    for _ in range(6):
        two.next()
        waits.append(two.ended(opened=True, served=0.5))
    assert waits == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    two.next()
    assert two.ended(opened=True, served=1.0) == 0.0  # one that served long enough: at once


def test_nodes_that_drop_every_connection_before_it_is_used_still_cost_a_wait_per_round():
    two = rotation(2)
    waits = []
    for _ in range(6):
        two.next()
        waits.append(two.ended(opened=True, served=None))
    assert waits == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_a_rotation_needs_a_node():
    with pytest.raises(ValueError):
        Rotation([], midpoint_backoff())


def test_the_consumer_and_the_publisher_go_round_every_node():
    from dispatcher.broker.supervisor import Supervisor
    from dispatcher.observe.metrics import Metrics

    loop = Loop()
    supervisor = Supervisor(CLUSTER, Metrics(), loop, lambda _name, _received: None)
    assert supervisor.nodes == ("rabbit-0:5672", "rabbit-1:5671", "[fd00::2]:5673")
    try:
        publisher = Publisher(CLUSTER, loop)
        labels = [n.label for n in publisher._rotation.nodes]
        assert labels == ["rabbit-0:5672", "rabbit-1:5671", "[fd00::2]:5673"]
        assert publisher._rotation.nodes[0].parameters.client_properties == {
            "connection_name": "disp-publisher"
        }
    finally:
        loop.close()


def test_knative_vhost_applies_to_every_node_of_rabbitmq_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no config file: drop-in mode
    env = {
        "QUEUE_NAME": "t.default.trig",
        "RABBIT_URL": "amqp://u:p@rabbit:5672/%2F",
        "RABBITMQ_URL": "amqp://u:p,w@rabbit-0:5672/%2F, amqp://u:p,w@rabbit-1:5672/%2F",
        "RABBITMQ_VHOST": "team/a",
        "SUBSCRIBER": "http://svc/",
    }
    broker = load_settings(None, env).broker
    assert broker.urls == (
        "amqp://u:p,w@rabbit-0:5672/team%2Fa",
        "amqp://u:p,w@rabbit-1:5672/team%2Fa",
    )
    assert virtual_host(broker) == "team/a"


def test_a_failed_connect_is_described_by_what_went_wrong() -> None:
    """pika wraps a failed connect three deep with an empty message at each level:
    every "broker connect failed" line said ``AMQPConnectionError: `` and nothing
    else (a certificate that does not verify, a refused connection alike)."""
    loop = Loop("test")
    errors: list[BaseException] = []
    try:
        LoopConnection(
            loop,
            pika.URLParameters(f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"),
            on_open_error_callback=lambda _c, e: (errors.append(e), loop.request_stop()),
        )
        loop.run()
    finally:
        loop.close()
    described = describe_error(errors[0])
    assert described.startswith("ConnectionRefusedError: "), described
    assert "Connection refused" in described
