"""Helpers shared by the deployment tests: load objects, validate them, check configs."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.process import child_env

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dispatcher"
PLAIN = ROOT / "deploy" / "kubernetes"
KUBE_VERSION = "1.30"
# A stand-in for the URL the Secret holds; it must never show up in a manifest.
DUMMY_BROKER_URL = "amqp://tester:not-a-secret@broker.invalid:5672/%2F"
# The same for the dedupe store's Secret (DEDUPE_STORE_URL).
DUMMY_STORE_URL = "redis://:not-a-secret@store.invalid:6379/0"
# What a Secret-backed variable stands for when `dispatcher check` runs a pod's env.
_DUMMY_SECRETS = {"DEDUPE_STORE_URL": DUMMY_STORE_URL}
# Custom resources kubernetes-validate has no schema for: it can only warn.
CRD_KINDS = {"ServiceMonitor", "ScaledObject", "TriggerAuthentication"}


def load_objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def yaml_mapping(text: str) -> dict[str, Any]:
    document = yaml.safe_load(text)
    assert isinstance(document, dict), f"expected a YAML mapping, got {type(document).__name__}"
    return document


def config_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The service config file held by the (only) ConfigMap."""
    return yaml_mapping(the(objects, "ConfigMap")["data"]["dispatcher.yaml"])


def find(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj.get("kind") == kind]


def the(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(objects, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]


def container(deployment: Mapping[str, Any], name: str = "dispatcher") -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    matches: list[dict[str, Any]] = [c for c in containers if c["name"] == name]
    assert matches, f"no container {name!r} in {[c['name'] for c in containers]}"
    return matches[0]


def env_of(container_spec: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in container_spec.get("env", [])}


def plain_values(env: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The literal ``value`` variables of a container (the Secret ones are left out)."""
    return {name: entry["value"] for name, entry in env.items() if "value" in entry}


def strings_in(node: object) -> Iterator[str]:
    """Every string (keys and values) in a parsed manifest."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from strings_in(key)
            yield from strings_in(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings_in(item)


def kubernetes_validate(*paths: Path) -> subprocess.CompletedProcess[str]:
    """``kubernetes-validate --strict -k 1.30`` from this interpreter's environment."""
    tool = Path(sys.executable).parent / "kubernetes-validate"
    return subprocess.run(
        [str(tool), "--strict", "-k", KUBE_VERSION, *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_valid(objects: list[dict[str, Any]], *paths: Path) -> None:
    """Every core object passes strict validation; custom resources may only warn."""
    result = kubernetes_validate(*paths)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert "ERROR" not in report, report
    passed = len(re.findall(r"^INFO .* passed for resource ", report, re.MULTILINE))
    core = [obj for obj in objects if obj["kind"] not in CRD_KINDS]
    assert passed == len(core), f"{len(core)} core objects, {passed} passed:\n{report}"
    for line in report.splitlines():
        if line.startswith("WARN"):
            # A warning is acceptable only for a kind that has no schema to check against.
            assert any(f"kind {kind} " in line for kind in CRD_KINDS), line


def image_env() -> dict[str, str]:
    """The ENV the container image sets (read from the Dockerfile), which manifests override.

    The image deliberately sets no DISPATCHER_* variable (see the Dockerfile).
    """
    dockerfile = ROOT / "Dockerfile"
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip().upper().startswith("ENV "):
            for token in shlex.split(line.strip()[4:], comments=True):
                name, equals, value = token.partition("=")
                if equals:
                    env[name] = value
    return env


def dispatcher_check(
    env: Mapping[str, str], config: Path | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m dispatcher check`` as the pod would run it: image ENV, then the manifest's."""
    args = [sys.executable, "-m", "dispatcher", "check"]
    if config is not None:
        args += ["--config", str(config)]
    return subprocess.run(
        args,
        env=child_env({**image_env(), **env}),  # nothing of the caller's but the basics
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def pod_check_env(
    deployment: Mapping[str, Any], container_name: str = "dispatcher"
) -> dict[str, str]:
    """The literal env of a container plus the Secrets' URLs replaced by dummy ones."""
    env = env_of(container(deployment, container_name))
    values = plain_values(env)
    for name, entry in env.items():
        if "valueFrom" in entry:
            values[name] = _DUMMY_SECRETS.get(name, DUMMY_BROKER_URL)
    return values
