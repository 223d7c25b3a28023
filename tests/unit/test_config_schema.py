"""The chart's config schema is generated from the loader's rule table and kept up to date."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from hypothesis import HealthCheck, assume, given

from dispatcher.config import reference, settings_from_dict
from dispatcher.config import schema as config_schema
from dispatcher.errors import ConfigError
from tests.support.fuzz import fuzz_settings
from tests.unit.test_fuzz_config import config_trees

ROOT = Path(__file__).resolve().parents[2]
CHART_SCHEMA = ROOT / config_schema.CHART_SCHEMA
EXAMPLE = ROOT / "config" / "dispatcher.example.yaml"


def test_checked_in_chart_schema_is_the_generated_one() -> None:
    text = CHART_SCHEMA.read_text(encoding="utf-8")
    wanted = config_schema.render(config_schema.chart_values_schema(json.loads(text)))
    assert text == wanted, (
        f"{CHART_SCHEMA.relative_to(ROOT)} differs from the config rules: "
        f"run {config_schema.REGENERATE} and commit the result"
    )


def test_check_mode_reports_a_stale_file(tmp_path: Path, capsys: Any) -> None:
    stale = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    stale["properties"]["config"]["properties"]["bindings"]["items"]["properties"].pop("ordered")
    path = tmp_path / "values.schema.json"
    path.write_text(json.dumps(stale), encoding="utf-8")
    assert config_schema.main(["--chart-schema", str(path), "--check"]) == 1
    assert "make schema" in capsys.readouterr().err
    assert config_schema.main(["--chart-schema", str(path)]) == 0
    assert config_schema.main(["--chart-schema", str(path), "--check"]) == 0


def test_backoff_delay_zero_is_refused_by_the_schema() -> None:
    # The drift issue 12 names: the hand-written schema allowed it.
    schema = config_schema.service_schema()
    base = {"name": "a", "queue": "a", "subscriber": "http://s/"}
    for zero in (0, 0.0, "0s", "0", "PT0S", "0.000ms"):
        binding = {**base, "delivery": {"backoff_delay": zero}}
        assert not _valid(schema, {"bindings": [binding]}), zero
    assert _valid(schema, {"bindings": [{**base, "delivery": {"backoff_delay": "10ms"}}]})


def test_filters_in_the_schema_say_what_the_service_says() -> None:
    schema = config_schema.service_schema()
    base = {"name": "a", "queue": "a", "subscriber": "http://s/"}
    nested = [{"all": [{"exact": {"type": "t"}}, {"not": {"any": [{"prefix": {"id": "x"}}]}}]}]
    for filters, service_accepts in (
        (nested, True),
        ([{"cesql": "type = 't'"}], True),
        ([{"any": [{"cesql": "type = 't'"}, {"cesql": "EXISTS subject"}]}], True),
        ([{"cesql": ""}], False),
        ([{"cesql": 1}], False),
        ([{"exact": {"type": "t"}, "prefix": {"id": "x"}}], False),
        ([{"exact": {}}], False),
        ([{"suffix": {"Type": "t"}}], False),
        ([{"any": []}], False),
    ):
        binding = {**base, "filters": filters}
        assert _valid(schema, {"bindings": [binding]}) is service_accepts, filters
        try:
            settings_from_dict({"bindings": [binding]}, {})
        except ConfigError:
            assert not service_accepts, filters
        else:
            assert service_accepts, filters


def test_example_config_is_valid_for_service_and_chart() -> None:
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    jsonschema.validate(example, config_schema.service_schema())
    del example["broker"]["url"]  # the chart takes it from brokerSecret only
    jsonschema.validate(example, config_schema.chart_config_schema())


def _valid(schema: dict[str, Any], document: object) -> bool:
    return bool(jsonschema.Draft7Validator(schema).is_valid(document))


@given(tree=config_trees(junk=False))
@fuzz_settings(100, suppress=list(HealthCheck))
def test_schema_accepts_whatever_the_service_accepts(tree: dict[str, Any]) -> None:
    # The schema may be looser than the loader (JSON Schema cannot compare two
    # durations), never stricter: a valid config must never be refused by Helm.
    # Trees without junk, so most are valid; the rest (rules between keys) are
    # discarded, and hypothesis fails the test if it cannot find valid ones.
    try:
        settings_from_dict(tree, {})
    except ConfigError:
        assume(False)
    try:
        document = json.loads(json.dumps(tree))  # what Helm hands to the schema
    except (TypeError, ValueError):
        return  # bytes, dates: not values Helm can carry
    errors = list(jsonschema.Draft7Validator(config_schema.service_schema()).iter_errors(document))
    assert not errors, [(list(e.path), e.message) for e in errors]


def test_checked_in_key_reference_is_the_generated_one(tmp_path: Path) -> None:
    page = ROOT / reference.PAGE
    assert page.read_text(encoding="utf-8") == reference.page(), (
        f"{reference.PAGE} differs from the settings models: run {reference.REGENERATE}"
    )
    stale = tmp_path / "keys.md"
    stale.write_text(reference.page().replace("| `bindings[].ordered` |", "| `ordered` |"))
    assert reference.main(["--page", str(stale), "--check"]) == 1
    assert reference.main(["--page", str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == reference.page()


def test_the_key_reference_lists_every_key_the_loader_reads() -> None:
    # Every key the example file writes (it writes every key) is in the page.
    listed = {
        line.split("`")[1] for line in reference.page().splitlines() if line.startswith("| `")
    }
    example = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))

    def paths(node: object, prefix: str) -> set[str]:
        if isinstance(node, list):
            return set().union(
                *(paths(item, f"{prefix}[].") for item in node if isinstance(item, dict))
            )
        if not isinstance(node, dict):
            return set()
        found = set()
        for key, value in node.items():
            found.add(f"{prefix}{key}")
            if key not in ("headers", "filters", "attributes", "url", "retry_on"):
                found |= {p for p in paths(value, f"{prefix}{key}.") if not p.endswith(".")}
        return found

    written = {p.replace(".[]", "[]") for p in paths(example, "")}
    assert written <= listed, written - listed
    assert "bindings[].delivery.retry_on" in listed and "tracing.sample_ratio" in listed
