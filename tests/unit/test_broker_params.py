from __future__ import annotations

from dispatcher.broker_params import connection_parameters, virtual_host
from dispatcher.config import BrokerSettings
from dispatcher.loop import Loop
from dispatcher.publisher import Publisher


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
    from dispatcher.broker_params import reconnect_backoff
    from dispatcher.config import ReconnectSettings

    broker = BrokerSettings(reconnect=ReconnectSettings(initial_delay=1.0, max_delay=4.0))
    backoff = reconnect_backoff(broker, rng=lambda: 0.5)  # the jitter's midpoint
    assert [backoff.wait(n) for n in range(4)] == [1.0, 2.0, 4.0, 4.0]
    loop = Loop()
    try:
        publisher = Publisher(broker, loop)  # connects only once started
        assert publisher._reconnect == reconnect_backoff(broker, publisher._reconnect.rng)
    finally:
        loop.close()
