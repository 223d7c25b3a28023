"""`check` accepts exactly what `run` can start with: what only pika, ssl or
redis-py can read is read before anything starts, and an error names the key,
or the variable the value came from."""

from __future__ import annotations

from pathlib import Path

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


def test_a_store_url_redis_cannot_read_is_refused_by_check_naming_its_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = "redis://:secret@localhost:6379/0?socket_timeout=abc"
    error = check(tmp_path, {"dedupe": {"store": store}}, capsys)
    assert error.startswith("dispatcher: dedupe.store: "), error
    assert "socket_timeout" in error and "secret" not in error
    monkeypatch.setenv("DEDUPE_STORE_URL", store)
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: DEDUPE_STORE_URL: "), error


def test_a_broker_url_from_rabbitmq_url_is_blamed_on_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RABBITMQ_URL", "amqp://h/?ssl_options={'protocol': 16}")
    error = check(tmp_path, {}, capsys)
    assert error.startswith("dispatcher: RABBITMQ_URL: invalid connection parameter in ")
    assert "cafile, capath and cadata cannot be all omitted" in error


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
