"""Broker URLs read without pika (``dispatcher.config.amqp``) exactly as pika reads them.

The configuration refuses what ``pika.URLParameters`` would refuse, with pika's
own message, and compares virtual hosts as pika reads them, without importing
pika. Here the two readings are compared on generated URLs: the same decision,
the same exception type and message, the same virtual host. The one reading
left to pika (an ``ssl_options`` mapping that names CA files or a protocol,
which needs an ``ssl.SSLContext``) has its own test below.
"""

from __future__ import annotations

import re
from pathlib import Path

import pika
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from dispatcher import cli
from dispatcher.config import amqp
from tests.support.fuzz import fuzz_settings

PROPERTY = fuzz_settings(500)

PARAMETERS = [
    "blocked_connection_timeout",
    "channel_max",
    "client_properties",
    "connection_attempts",
    "frame_max",
    "heartbeat",
    "locale",
    "retry_delay",
    "socket_timeout",
    "stack_timeout",
    "ssl_options",
    "tcp_options",
]
NUMBERS = [
    "0",
    "1",
    "-1",
    "+5",
    " 7 ",
    "1_000",
    "4095",
    "4096",
    "131072",
    "131073",
    "65535",
    "65536",
    "1.5",
    "-0.0",
    "1e3",
    "1e999",
    "nan",
    "inf",
    "-inf",
    "abc",
    "9" * 5000,
]
# Python literals, as client_properties, tcp_options and ssl_options take them
# (but for ssl_options mappings naming CA files or a protocol: see below).
LITERALS = [
    "None",
    "{}",
    "{'connection_name': 'x'}",
    "{'certfile': 'c.pem'}",
    "{'ca_certs': None, 'cafile': None}",
    "[1]",
    "['protocol']",
    "('protocol',)",
    "{'protocol'}",
    "'protocol'",
    "'x'",
    "b'x'",
    "1",
    "1j",
    "True",
    "...",
    "x",
    "{",
    "%7B",
    "(",
    "__import__('os')",
    "[" * 300,
]
VALUES = st.one_of(st.sampled_from(NUMBERS + LITERALS), st.text(max_size=12))
QUERY_PAIRS = st.lists(
    st.tuples(
        st.one_of(st.sampled_from([*PARAMETERS, "x", "HEARTBEAT"]), st.text(max_size=6)), VALUES
    ),
    max_size=3,
)


def _query(pairs: list[tuple[str, str]]) -> str:
    return "&".join(f"{name}={value}" for name, value in pairs)


URLS = st.builds(
    lambda scheme, userinfo, host, port, path, query: (
        f"{scheme}://{userinfo}{host}{port}{path}{'?' + _query(query) if query else ''}"
    ),
    st.sampled_from(["amqp", "amqps", "AMQP", "AmQpS"]),
    st.sampled_from(["", "u@", "u:p@", "u:@", ":p@", "u%40x:p%2F@", "@"]),
    st.sampled_from(["h", "rabbit-0.rabbit.svc", "[::1]", "10.0.0.1"]),
    st.sampled_from(["", ":5672", ":0", ":65535", ":99999", ":x", ":"]),
    st.one_of(
        st.sampled_from(["", "/", "/%2F", "/%2f", "/vh", "/a;b/c", "/a;b", "/a%2Fb/x", "//", "/%"]),
        st.text(max_size=8).map(lambda text: "/" + text),
    ),
    QUERY_PAIRS,
)


def _stable(message: str) -> str:
    """Without the addresses in ast node reprs (``<ast.Name object at 0x...>``)."""
    return re.sub(r" at 0x[0-9a-f]+>", ">", message)


def pika_reading(url: str) -> tuple[object, str]:
    try:
        return "accepted", pika.URLParameters(url).virtual_host
    except Exception as e:
        return type(e), _stable(str(e))


def our_reading(url: str) -> tuple[object, str]:
    try:
        amqp.check_url(url)
    except Exception as e:
        return type(e), _stable(str(e))
    return "accepted", amqp.virtual_host(url)


def _names_a_ca_or_protocol(url: str) -> bool:
    """An ssl_options mapping pika would turn into an ssl.SSLContext."""
    return bool(re.search(r"ssl_options=\{.*('ca|'protocol)", url))


@PROPERTY
@given(URLS)
@example("amqp://guest:guest@localhost:5672/%2F")
@example("amqp://h/?heartbeat=abc")
@example("amqp://h/?channel_max=-1")
@example("amqp://h/?ssl_options=%7B")
@example("amqp://h/?connection_attempts=1e999")
@example("amqps://h/?ssl_options=x")
@example("amqps://h/?ssl_options=None")
@example("amqp://h/?ssl_options=None")
@example("amqp://h/?heartbeat=1&heartbeat=2")
@example("amqp://user@host/")
@example("amqp://h/a;b/c")
@example(" amqp://h/")
def test_a_url_is_read_as_pika_reads_it(url: str) -> None:
    if _names_a_ca_or_protocol(url):
        return
    assert our_reading(url) == pika_reading(url)


def test_every_parameter_pika_reads_is_read() -> None:
    setters = {name for name in dir(pika.URLParameters) if name.startswith("_set_url_")}
    assert {name.removeprefix("_set_url_") for name in setters} == set(PARAMETERS)
    for name in PARAMETERS:
        assert our_reading(f"amqp://h/?{name}=") == ("accepted", "/")  # blank: ignored by both


def test_ssl_options_naming_ca_files_are_left_to_pika() -> None:
    """pika builds an ssl.SSLContext from them, which the configuration cannot
    without the ssl module: accepted here, refused by pika when a file is missing."""
    url = "amqp://h/?ssl_options={'cafile': '/nonexistent/ca.pem'}"
    assert our_reading(url) == ("accepted", "/")
    assert pika_reading(url)[0] is FileNotFoundError


@pytest.mark.parametrize(
    ("options", "pika_says"),
    [
        ("{'cafile': '/nonexistent/ca.pem'}", "No such file or directory"),
        ("{'protocol': 16}", "cafile, capath and cadata cannot be all omitted"),
        ("{'protocol': 'x'}", "cannot be interpreted as an integer"),
    ],
)
def test_the_command_line_refuses_what_only_pika_can_read(
    options: str, pika_says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the configuration leaves to pika is read by the broker side before
    anything starts, `check` included: a config error naming the key (exit 2),
    not a crash at connect time."""
    url = f"amqp://guest:secret@localhost:5672/%2F?ssl_options={options}"
    assert our_reading(url) == ("accepted", "/")
    config = tmp_path / "dispatcher.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "broker": {"url": url},
                "bindings": [{"name": "b", "queue": "q", "subscriber": "http://127.0.0.1:9/"}],
            }
        )
    )
    for command in ("check", "archive"):
        extra = ["--queue", "q", "--out", str(tmp_path / "out")] if command == "archive" else []
        assert cli.main([command, "--config", str(config), *extra]) == 2
        error = capsys.readouterr().err
        assert error.startswith("dispatcher: broker.url: invalid connection parameter in ")
        assert pika_says in error and "secret" not in error
