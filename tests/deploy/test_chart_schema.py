"""The generated config schema, as Helm itself applies it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import CHART
from tests.support.helm import run_helm

pytestmark = pytest.mark.deploy

BINDING = {"name": "orders", "queue": "orders", "subscriber": "http://subscriber/"}


@pytest.mark.parametrize("command", ["lint", "template"])
@pytest.mark.parametrize("zero", [0, "0s", "PT0S"])
def test_backoff_delay_zero_is_refused(command: str, zero: object, tmp_path: Path) -> None:
    # The service refuses it (a refused message would requeue in a hot loop);
    # the hand-written schema accepted it, the generated one must not.
    values = tmp_path / "values.yaml"
    delivery = {"backoff_delay": zero}
    values.write_text(yaml.safe_dump({"config": {"bindings": [{**BINDING, "delivery": delivery}]}}))
    result = (
        run_helm(command, "dispatcher", CHART, "--values", values)
        if command == "template"
        else run_helm("lint", CHART, "--values", values)
    )
    assert result.returncode != 0, result.stdout
    assert "config.bindings.0.delivery.backoff_delay" in result.stdout + result.stderr


def test_a_positive_backoff_delay_renders(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    delivery = {"backoff_delay": "10ms"}
    values.write_text(yaml.safe_dump({"config": {"bindings": [{**BINDING, "delivery": delivery}]}}))
    result = run_helm("template", "dispatcher", CHART, "--values", values)
    assert result.returncode == 0, result.stderr
