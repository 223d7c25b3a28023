"""Building a Service from bad settings fails cleanly and leaves nothing bound or running."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import yaml
from prometheus_client import CollectorRegistry

from dispatcher import cli
from dispatcher.config import settings_from_dict
from dispatcher.errors import ConfigError
from dispatcher.ops.server import OpsServer
from dispatcher.service import Service
from tests.support.node import free_port


def test_a_bad_tls_file_is_a_config_error_before_any_socket_or_thread(tmp_path):
    bad = tmp_path / "not-a-certificate.pem"
    bad.write_text("garbage\n")
    port = free_port()
    raw = {
        "http": {"listen": f"127.0.0.1:{port}"},
        "bindings": [
            {"name": "good", "queue": "q1", "subscriber": "http://127.0.0.1:1/"},
            {
                "name": "bad",
                "queue": "q2",
                "subscriber": "https://127.0.0.1:1/",
                "tls": {"ca_file": str(bad)},
            },
        ],
    }
    threads = threading.active_count()
    with pytest.raises(ConfigError) as caught:
        Service(settings_from_dict(raw, {}))
    assert caught.value.key == "bindings[1].tls"
    assert threading.active_count() == threads  # no worker pool was started
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the metrics port was never taken


@pytest.mark.timeout(10)
def test_closing_a_listener_that_never_started_returns():
    server = OpsServer("127.0.0.1", 0, CollectorRegistry(), lambda: 0.0, dict, lambda: False)
    server.close()  # socketserver.shutdown() would wait forever for serve_forever


def test_a_probe_client_that_sends_nothing_is_dropped_not_kept_forever():
    server = OpsServer("127.0.0.1", 0, CollectorRegistry(), lambda: 0.0, dict, lambda: False)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as silent:
            silent.settimeout(30)
            started = time.monotonic()
            assert silent.recv(1) == b""  # the server closed it: its handler timed out
            assert time.monotonic() - started < 15
    finally:
        server.close()


@pytest.mark.parametrize("variable", [None, "DISPATCHER_LISTEN"])
def test_a_listen_address_in_use_names_where_it_came_from(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable
) -> None:
    """The contract: an error names the offending key or variable."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        http = {"listen": "127.0.0.1:0"} if variable else {"listen": listen}
        if variable:
            monkeypatch.setenv(variable, listen)
        path = tmp_path / "dispatcher.yaml"
        binding = {"name": "b", "queue": "q", "subscriber": "http://127.0.0.1:1/"}
        path.write_text(yaml.safe_dump({"http": http, "bindings": [binding]}))
        assert cli.main(["run", "--config", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"dispatcher: {variable or 'http.listen'}: cannot listen on {listen}")
