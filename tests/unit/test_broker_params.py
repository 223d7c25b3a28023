from __future__ import annotations

from dispatcher.broker_params import connection_parameters, virtual_host
from dispatcher.config import BrokerSettings


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
