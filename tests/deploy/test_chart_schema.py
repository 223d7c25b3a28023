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


def _nested(depth: int, innermost: dict[str, object]) -> dict[str, object]:
    entry = innermost
    for level in range(depth):
        entry = {"not": entry} if level % 2 else {"all": [entry]}
    return entry


def _template_filters(tmp_path: Path, entry: dict[str, object]):  # type: ignore[no-untyped-def]
    values = tmp_path / "values.yaml"
    binding = {**BINDING, "filters": [entry]}
    values.write_text(yaml.safe_dump({"config": {"bindings": [binding]}}))
    return run_helm("template", "dispatcher", CHART, "--values", values)


def test_filters_are_checked_at_any_depth(tmp_path: Path) -> None:
    # One schema of a filter entry, referring to itself: a mistake five levels
    # down is refused by helm as one at the top is (the inline schema stopped at 2).
    good = _template_filters(tmp_path, _nested(5, {"exact": {"type": "t"}}))
    assert good.returncode == 0, good.stderr
    bad = _template_filters(tmp_path, _nested(5, {"exact": {"type": ""}}))
    assert bad.returncode != 0, bad.stdout
    assert "config.bindings.0.filters.0.all.0.not.all.0.not.all.0.exact.type" in bad.stderr
