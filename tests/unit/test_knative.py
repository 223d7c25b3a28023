"""Knative drop-in mode: Knative's variables, defaults and meanings."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from dispatcher.config import load_settings
from dispatcher.errors import ConfigError

BASE = {
    "QUEUE_NAME": "t.default.trig",
    "RABBIT_URL": "amqp://u:p@rabbit:5672/%2F",
    "SUBSCRIBER": "http://svc.ns.svc.cluster.local/",
}


def load(tmp_path, monkeypatch, **env):
    monkeypatch.chdir(tmp_path)  # no config/dispatcher.yaml here
    return load_settings(None, {**BASE, **env})


def test_knative_defaults(tmp_path, monkeypatch):
    settings = load(tmp_path, monkeypatch)
    [b] = settings.bindings
    assert (b.queue, b.name, b.subscriber) == (
        "t.default.trig",
        "t.default.trig",
        BASE["SUBSCRIBER"],
    )
    assert b.parallelism == 1
    assert b.delivery.retry == 0
    assert b.delivery.backoff_policy == "exponential"
    assert b.delivery.backoff_delay == pytest.approx(0.05)
    assert b.delivery.timeout == 10.0
    assert b.declare is None  # the controller owns the queue
    assert b.dead_letter.exchange is None and b.reply.url is None
    assert settings.broker.url == BASE["RABBIT_URL"]


def test_knative_values(tmp_path, monkeypatch):
    settings = load(
        tmp_path,
        monkeypatch,
        PARALLELISM="8",
        RETRY="4",
        BACKOFF_POLICY="linear",
        BACKOFF_DELAY="1m30s",
        TIMEOUT="3s",
        DLX_NAME="t.dlx",
        BROKER_INGRESS_URL="http://broker-ingress/",
        DEAD_LETTER_SINK="http://dls/",
    )
    [b] = settings.bindings
    assert b.parallelism == 8 and b.delivery.retry == 4
    assert b.delivery.backoff_policy == "linear"
    assert b.delivery.backoff_delay == 90.0
    assert b.delivery.timeout == 3.0
    assert b.dead_letter.exchange == "t.dlx" and b.dead_letter.sink == "http://dls/"
    assert b.reply.url == "http://broker-ingress/"


def test_zero_delay_and_timeout_keep_knative_and_our_defaults(tmp_path, monkeypatch):
    [b] = load(tmp_path, monkeypatch, BACKOFF_DELAY="0s", TIMEOUT="0s").bindings
    assert b.delivery.backoff_delay == pytest.approx(0.05)
    assert b.delivery.timeout == 10.0


def test_rabbitmq_url_overrides_rabbit_url(tmp_path, monkeypatch):
    settings = load(tmp_path, monkeypatch, RABBITMQ_URL="amqp://x:y@other:5672/%2F")
    assert settings.broker.url == "amqp://x:y@other:5672/%2F"


def test_a_config_file_wins_over_queue_name(tmp_path, monkeypatch):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/dispatcher.yaml").write_text(
        "bindings: [{name: f, queue: fileq, subscriber: 'http://127.0.0.1:1/'}]\n"
    )
    assert load(tmp_path, monkeypatch).bindings[0].queue == "fileq"


def test_error_names_the_variable(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, monkeypatch, RETRY="-2")
    assert str(caught.value) == "RETRY: must be >= 0"


def test_backoff_is_not_capped_below_knatives_schedule(tmp_path, monkeypatch):
    [b] = load(tmp_path, monkeypatch, RETRY="6", BACKOFF_DELAY="2s").bindings
    assert b.delivery.backoff_max == 2.0 * 2**5  # the sixth retry waits 64 s in Knative


@pytest.mark.parametrize(("retry", "delay"), [("30", "1s"), ("100", "1h")])
def test_a_long_schedule_is_capped_at_the_longest_duration_not_refused(
    tmp_path, monkeypatch, retry, delay
):
    """RETRY=30 at 1s reaches 2^29 s: past the ten years a duration may be, which
    refused a Trigger Knative accepts, naming a key no variable sets."""
    [b] = load(tmp_path, monkeypatch, RETRY=retry, BACKOFF_DELAY=delay).bindings
    assert b.delivery.backoff_max == 3650 * 86400.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500µs", 0.0005),
        ("500us", 0.0005),
        ("1h2m3.5s", 3723.5),
        ("250ms", 0.25),
        ("0", 0.0),
        ("PT2S", 2.0),
        ("3", 3.0),
        ("1500ns", 1.5e-6),
        ("2μs", 2e-6),
    ],
)
def test_go_durations(text, seconds):
    from dispatcher.config import parse_duration

    assert parse_duration(text, "BACKOFF_DELAY") == pytest.approx(seconds)


def test_vhost_and_subscriber_ca_certificates(tmp_path, monkeypatch):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    settings = load(tmp_path, monkeypatch, RABBITMQ_VHOST="team/a", SUBSCRIBER_CACERTS=pem)
    assert settings.broker.url == "amqp://u:p@rabbit:5672/team%2Fa"
    [b] = settings.bindings
    assert b.tls.ca_file is not None
    with open(b.tls.ca_file) as stream:
        assert stream.read() == pem


def test_restarts_with_the_same_certificates_leave_one_private_file(tmp_path, monkeypatch):
    """Every start wrote a new temporary file and none was ever removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    pems = [f"-----BEGIN CERTIFICATE-----\nMII{n}\n-----END CERTIFICATE-----\n" for n in "AB"]
    paths = [
        load(tmp_path, monkeypatch, SUBSCRIBER_CACERTS=pem).bindings[0].tls.ca_file
        for pem in (pems[0], pems[0], pems[0], pems[1])
    ]
    assert paths[0] == paths[1] == paths[2] != paths[3]
    [folder] = (tmp_path / "tmp").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted({Path(p).name for p in paths})
    assert [Path(p).read_text() for p in paths[2:]] == pems
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(Path(p).stat().st_mode) == 0o600 for p in paths)


def test_certificates_are_not_written_into_a_folder_others_can_change(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    shared = tmp_path / f"dispatcher-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match=r"SUBSCRIBER_CACERTS: .*writable by other users"):
        load(tmp_path, monkeypatch, SUBSCRIBER_CACERTS="pem")
    assert list(shared.iterdir()) == []


def test_a_damaged_certificate_file_is_written_again(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pem = "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
    path = Path(load(tmp_path, monkeypatch, SUBSCRIBER_CACERTS=pem).bindings[0].tls.ca_file)
    path.write_text(pem[:10])  # cut short, as a crash mid-write elsewhere could leave it
    assert load(tmp_path, monkeypatch, SUBSCRIBER_CACERTS=pem).bindings[0].tls.ca_file == str(path)
    assert path.read_text() == pem
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_certificates_that_are_not_text_are_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    undecodable = b"\xff\xfe".decode("utf-8", "surrogateescape")  # as os.environ holds it
    with pytest.raises(ConfigError, match="SUBSCRIBER_CACERTS: is not UTF-8 text"):
        load(tmp_path, monkeypatch, SUBSCRIBER_CACERTS=undecodable)


def test_vhost_applies_to_the_rabbitmq_url_override_too(tmp_path, monkeypatch):
    settings = load(
        tmp_path, monkeypatch, RABBITMQ_URL="amqp://u:p@other:5672/%2F", RABBITMQ_VHOST="tenant"
    )
    assert settings.broker.url == "amqp://u:p@other:5672/tenant"


def test_a_password_with_an_unencoded_slash_is_never_shown_with_a_vhost(tmp_path, monkeypatch):
    """Rebuilt with the vhost, the URL lost everything after the slash, and the
    error quoted the first half of the password with nothing left to mask."""
    url = "amqp://guest:Kx9s3cretPart/Tail7@127.0.0.1:5672/%2F"
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, monkeypatch, RABBIT_URL=url, RABBITMQ_VHOST="xs")
    assert caught.value.key == "RABBIT_URL"
    assert "Kx9s3cret" not in str(caught.value) and "Tail7" not in str(caught.value)


def test_a_long_backoff_delay_without_retries_loads(tmp_path, monkeypatch):
    # RETRY defaults to 0; the requeue wait still uses BACKOFF_DELAY, so the cap follows it.
    [b] = load(tmp_path, monkeypatch, BACKOFF_DELAY="1m").bindings
    assert b.delivery.backoff_delay == 60.0
    assert b.delivery.backoff_max >= 60.0


def test_the_rest_of_knatives_environment_changes_nothing(tmp_path, monkeypatch):
    # What the eventing-rabbitmq controller also sets: no filter, no auth, no
    # setting this maps (docs/operations.md lists them as ignored).
    controller = {
        "K_LOGGING_CONFIG": '{"zap-logger-config": "{}"}',
        "K_OBSERVABILITY_CONFIG": "{}",
        "K_KLOG_VERBOSITY": "0",
        "SYSTEM_NAMESPACE": "knative-eventing",
        "NAMESPACE": "default",
        "CONTAINER_NAME": "dispatcher",
        "POD_NAME": "trig-dispatcher-0",
        "REQUEUE": "false",
    }
    plain = load(tmp_path, monkeypatch)
    assert load(tmp_path, monkeypatch, **controller) == plain
    [binding] = plain.bindings
    assert binding.filter is None and binding.filters == ()
    assert binding.auth.bearer_token_file is None


def test_a_ca_bundle_that_cannot_be_loaded_is_blamed_on_subscriber_cacerts(tmp_path, monkeypatch):
    """It was blamed on bindings[0].tls, a key the drop-in user cannot see."""
    from dispatcher.resolve import resolve

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {**BASE, "SUBSCRIBER_CACERTS": "garbage"}, resolve)
    assert str(caught.value).startswith("SUBSCRIBER_CACERTS: cannot load: ")
