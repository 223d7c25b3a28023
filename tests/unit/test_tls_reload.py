"""Broker TLS files read again at each connect when they changed (a rotated client
certificate), and a half-written one never replacing what works."""

from __future__ import annotations

import os
import time
from pathlib import Path

import structlog

from dispatcher.broker.params import nodes
from dispatcher.config import BrokerSettings, TlsSettings
from dispatcher.credentials.tls import ReloadingContext
from tests.support.node import make_tls_material


def _point(link: Path, target: Path) -> None:
    """Swap ``link`` to ``target`` at once, as a Kubernetes Secret volume does."""
    staged = link.with_suffix(".new")
    staged.symlink_to(target)
    os.replace(staged, link)


def _aged(*paths: Path) -> None:
    """Modified a minute ago: past the racy window (``file_identity``), in which a
    file counts as changed at every look."""
    for path in paths:
        for file in path.rglob("*") if path.is_dir() else [path]:
            past = time.time() - 60
            os.utime(file, (past, past))


def _serial(context: object) -> str:
    return str(context.get_ca_certs()[0]["serialNumber"])  # type: ignore[attr-defined]


def test_a_rotated_file_is_used_from_the_next_connect_and_a_broken_one_never(
    tmp_path: Path,
) -> None:
    old, new = make_tls_material(tmp_path / "old"), make_tls_material(tmp_path / "new")
    _aged(old, new)
    link = tmp_path / "ca.pem"
    link.symlink_to(old / "ca.pem")
    broker = BrokerSettings(
        url="amqps://guest:guest@localhost:5671/%2F", tls=TlsSettings(ca_file=str(link))
    )
    [node] = nodes(broker, "test")
    first = node.parameters.ssl_options.context
    assert node.parameters.ssl_options.context is first  # unchanged: not built again
    _point(link, new / "ca.pem")
    rotated = node.parameters.ssl_options.context
    assert rotated is not first and _serial(rotated) != _serial(first)
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nhalf writ")
    _aged(junk)
    with structlog.testing.capture_logs() as logged:
        _point(link, junk)
        assert node.parameters.ssl_options.context is rotated  # what works stays
        assert node.parameters.ssl_options.context is rotated
    said = [e["event"] for e in logged]
    assert said == ["broker TLS files changed and cannot be used: the previous ones stay"]


def test_unchanged_files_cost_a_stat_and_nothing_more(tmp_path: Path) -> None:
    material = make_tls_material(tmp_path)
    _aged(material)
    reloading = ReloadingContext(TlsSettings(ca_file=str(material / "ca.pem")))
    assert reloading.current() is reloading.current()


def test_a_file_modified_within_the_racy_window_is_read_again_until_it_settles(
    tmp_path: Path,
) -> None:
    """Rewritten in place within a timestamp tick, a file keeps its identity: until
    its modification time is past the racy window, every connect reads it again."""
    material = make_tls_material(tmp_path)  # just written
    reloading = ReloadingContext(TlsSettings(ca_file=str(material / "ca.pem")))
    assert reloading.current() is not reloading.current()
    _aged(material)
    settled = reloading.current()
    assert reloading.current() is settled
