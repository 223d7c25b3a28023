"""`check` accepts exactly what `run` can start with: one resolve step reads
what only pika, ssl, the proxy variables or redis-py can read before anything
starts, and an error names the key, or the variable the value came from."""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import quote

import pytest
import yaml

from dispatcher import cli

BINDING = {"name": "b", "queue": "q", "subscriber": "http://127.0.0.1:9/"}


def check(tmp_path: Path, config: dict[str, object], capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "dispatcher.yaml"
    path.write_text(yaml.safe_dump({"bindings": [BINDING], **config}))
    assert cli.main(["check", "--config", str(path)]) == 2
    return capsys.readouterr().err


def test_a_tls_file_that_cannot_be_loaded_is_refused_by_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    binding = {**BINDING, "tls": {"ca_file": str(junk)}}
    error = check(tmp_path, {"bindings": [binding]}, capsys)
    assert error.startswith("dispatcher: bindings[0].tls: cannot load: "), error
    broker = {"url": "amqps://guest:secret@localhost/%2F", "tls": {"ca_file": str(junk)}}
    error = check(tmp_path, {"broker": broker}, capsys)
    assert error.startswith("dispatcher: broker.tls: cannot load: "), error


def test_an_encrypted_key_is_refused_at_once_not_prompted_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenSSL asks for a passphrase on the terminal when none is given: ``check``
    and ``run`` waited there for good (without a terminal: stray prompts, then
    "[Errno 22] Invalid argument")."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-days", "1", "-subj", "/CN=x",
         "-keyout", "key.pem", "-out", "cert.pem", "-passout", "pass:secret"],
        cwd=tmp_path, check=True, capture_output=True,
    )  # fmt: skip
    tls = {"cert_file": str(tmp_path / "cert.pem"), "key_file": str(tmp_path / "key.pem")}
    broker = {"url": "amqps://guest:guest@localhost/%2F", "tls": tls}
    error = check(tmp_path, {"broker": broker}, capsys)
    assert error.startswith("dispatcher: broker.tls: cannot load: the private key is encrypted")


def test_a_store_url_redis_cannot_read_is_refused_by_check_naming_its_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = "redis://:secret@localhost:6379/0?health_check_interval=abc"
    error = check(tmp_path, {"dedupe": {"store": store}}, capsys)
    assert error.startswith("dispatcher: dedupe.store: "), error
    assert "health_check_interval" in error and "secret" not in error
    monkeypatch.setenv("DEDUPE_STORE_URL", store)
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: DEDUPE_STORE_URL: "), error


def test_a_store_url_with_a_parameter_redis_has_no_keyword_for_is_refused_by_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py reads any query parameter into a keyword and only a connection's
    constructor refuses it: ``check`` said valid and the running service's store
    stayed down, with a traceback on every probe."""
    monkeypatch.setenv("DEDUPE_STORE_URL", "redis://:secret@127.0.0.1:6379/0?foo=bar")
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: DEDUPE_STORE_URL: a query parameter redis-py does not")
    assert "'foo'" in error and "secret" not in error


@pytest.mark.parametrize("query", ["socket_timeout=30", "socket_connect_timeout=5"])
def test_a_store_url_cannot_lift_the_bound_on_a_store_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    """redis-py lets the URL's query override the client's keywords: with
    ``socket_timeout=30`` a paused store held every delivery for the loop's 2 s
    bound, with the gauge at 1 and nothing logged."""
    monkeypatch.setenv("DEDUPE_STORE_URL", f"redis://:secret@127.0.0.1:6379/0?{query}")
    error = check(tmp_path, {}, capsys)
    name = query.split("=", maxsplit=1)[0]
    assert error.startswith(f"dispatcher: DEDUPE_STORE_URL: {name} cannot be set in the URL")
    assert "secret" not in error


def test_a_broker_url_from_rabbitmq_url_is_blamed_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RABBITMQ_URL", "amqp://h/?ssl_options={'protocol': 16}")
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: RABBITMQ_URL: invalid connection parameter in ")
    assert "cafile, capath and cadata cannot be all omitted" in error


def test_ssl_options_in_a_broker_url_are_refused_not_silently_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain pika honours them; here every amqps connection is wrapped in
    ``broker.tls``'s context, so the URL's CA and server name went unused: ``check``
    said valid and ``run`` never connected, with no reason given."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=ca", "-keyout", "ca.key", "-out", "ca.pem"],
        cwd=tmp_path, check=True, capture_output=True,
    )  # fmt: skip
    ca = tmp_path / "ca.pem"
    options = quote(str({"ca_certs": str(ca), "server_hostname": "localhost"}))
    monkeypatch.setenv(
        "RABBITMQ_URL", f"amqps://guest:secret@localhost:5671/%2F?ssl_options={options}"
    )
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: RABBITMQ_URL: "), error
    assert "ssl_options in the URL is not used; set broker.tls" in error
    assert "secret" not in error


def test_a_broker_url_with_a_user_and_no_password_is_refused_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pika's own error for it: "argument of type 'NoneType' is not iterable"."""
    monkeypatch.setenv("RABBITMQ_URL", "amqp://guest@localhost/%2F")
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: RABBITMQ_URL: 'amqp://guest@localhost/%2F' names a user")
    assert "without a password" in error


def test_in_knative_mode_the_broker_url_is_blamed_on_the_variable_that_gave_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no config file here: Knative drop-in mode
    monkeypatch.setenv("QUEUE_NAME", "q")
    monkeypatch.setenv("SUBSCRIBER", "http://127.0.0.1:9/")
    monkeypatch.setenv("RABBIT_URL", "amqp://good/")
    monkeypatch.setenv("RABBITMQ_URL", "amqp://h/?heartbeat=x")
    assert cli.main(["check"]) == 2
    assert capsys.readouterr().err.startswith("dispatcher: RABBITMQ_URL: ")
    monkeypatch.delenv("RABBITMQ_URL")
    monkeypatch.setenv("RABBIT_URL", "amqp://h/?heartbeat=x")
    assert cli.main(["check"]) == 2
    assert capsys.readouterr().err.startswith("dispatcher: RABBIT_URL: ")


@pytest.mark.parametrize(
    ("options", "pika_says"),
    [
        ("{'cafile': '/nonexistent/ca.pem'}", "No such file or directory"),
        ("{'protocol': 16}", "cafile, capath and cadata cannot be all omitted"),
        ("{'protocol': 'x'}", "cannot be interpreted as an integer"),
        ("", "Unknown URL parameter: 'nonsense'"),
    ],
)
def test_the_command_line_refuses_what_pika_cannot_read(
    options: str, pika_says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pika reads the broker URL before anything starts, `check` and the batch
    commands included: a config error naming the key (exit 2), not a crash at
    connect time, and never the password."""
    query = f"ssl_options={options}" if options else "nonsense=1"
    url = f"amqp://guest:secret@localhost:5672/%2F?{query}"
    config = tmp_path / "dispatcher.yaml"
    config.write_text(yaml.safe_dump({"broker": {"url": url}, "bindings": [BINDING]}))
    for command in ("check", "archive"):
        extra = ["--queue", "q", "--out", str(tmp_path / "out")] if command == "archive" else []
        assert cli.main([command, "--config", str(config), *extra]) == 2
        error = capsys.readouterr().err
        assert error.startswith("dispatcher: broker.url: invalid connection parameter in ")
        assert pika_says in error and "secret" not in error


def test_the_nodes_of_one_cluster_name_one_virtual_host_as_pika_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = ["amqp://a/v1", "amqp://b/v2"]
    error = check(tmp_path, {"broker": {"url": nodes}}, capsys)
    assert error == (
        "dispatcher: broker.url: every node of one cluster must name the same virtual host\n"
    )
    # %2F and an empty path are both pika's "/".
    config = tmp_path / "same.yaml"
    same = {"broker": {"url": ["amqp://a/%2F", "amqp://b"]}, "bindings": [BINDING]}
    config.write_text(yaml.safe_dump(same))
    assert cli.main(["check", "--config", str(config)]) == 0


def test_a_proxy_variable_run_would_refuse_is_refused_by_check_with_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "ftp://proxy.example")
    binding = {**BINDING, "subscriber": "http://127.0.0.1:9/", "reply": {"url": "https://r/"}}
    config = tmp_path / "dispatcher.yaml"
    config.write_text(yaml.safe_dump({"bindings": [binding]}))
    said = (
        "dispatcher: HTTPS_PROXY: must be a proxy URL for bindings[0].reply.url, "
        "got 'ftp://proxy.example'\n"
    )
    for command in ("check", "run"):
        assert cli.main([command, "--config", str(config)]) == 2
        assert capsys.readouterr().err == said
    # An http subscriber alone never goes through HTTPS_PROXY: accepted.
    config.write_text(yaml.safe_dump({"bindings": [BINDING]}))
    assert cli.main(["check", "--config", str(config)]) == 0


def test_a_token_file_run_would_refuse_is_refused_by_check_with_the_same_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "token"
    token.write_bytes(b" \n")
    config = tmp_path / "dispatcher.yaml"
    binding = {**BINDING, "auth": {"bearer_token_file": str(token)}}
    config.write_text(yaml.safe_dump({"bindings": [binding]}))
    said = f"dispatcher: bindings[0].auth.bearer_token_file: no token in {token}: empty\n"
    for command in ("check", "run"):
        assert cli.main([command, "--config", str(config)]) == 2
        assert capsys.readouterr().err == said
