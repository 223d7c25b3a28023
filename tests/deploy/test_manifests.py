"""The plain manifests in deploy/kubernetes: valid, checkable, and the chart's default render.

The chart is the source of truth; the plain files are what `helm template
dispatcher deploy/helm/dispatcher` gives, minus Helm's own bookkeeping. The
equivalence test keeps the two from drifting apart.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import knative, parse_duration
from tests.deploy.manifests import (
    CHART,
    DUMMY_BROKER_URL,
    PLAIN,
    assert_valid,
    config_of,
    container,
    dispatcher_check,
    env_of,
    load_objects,
    plain_values,
    pod_check_env,
    strings_in,
    the,
    yaml_mapping,
)
from tests.support.helm import run_helm, run_kubectl

pytestmark = pytest.mark.deploy

DROPIN = PLAIN / "knative-dropin" / "deployment.yaml"
# Every variable drop-in mode maps (its own table), but the optional CA bundle.
KNATIVE_VARIABLES = set(knative.ORIGINS.values()) - {"SUBSCRIBER_CACERTS"}
# Helm's bookkeeping, which plain manifests have no use for.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HELM_ONLY_ANNOTATIONS = ("checksum/config",)


def kustomization() -> dict[str, Any]:
    return yaml_mapping((PLAIN / "kustomization.yaml").read_text())


def resource_files() -> list[Path]:
    return [PLAIN / name for name in kustomization()["resources"]]


@pytest.fixture(scope="module")
def plain() -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for path in resource_files():
        objects += load_objects(path.read_text())
    return objects


@pytest.fixture(scope="module")
def dropin() -> dict[str, Any]:
    return the(load_objects(DROPIN.read_text()), "Deployment")


# --------------------------------------------------------------------------
# Valid and complete
# --------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    listed = {path.name for path in resource_files()}
    on_disk = {path.name for path in PLAIN.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    # No namespace baked in: `kubectl -n NS apply -k` or an overlay chooses it.
    assert "namespace" not in kustomization()


def test_every_plain_manifest_passes_kubernetes_validate(plain: list[dict[str, Any]]) -> None:
    objects = [*plain, *load_objects(DROPIN.read_text())]
    assert_valid(objects, *resource_files(), DROPIN)
    assert sorted(obj["kind"] for obj in plain) == [
        "ConfigMap",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]


def test_kustomize_build_is_valid(plain: list[dict[str, Any]], tmp_path: Path) -> None:
    result = run_kubectl("kustomize", PLAIN)
    assert result.returncode == 0, result.stderr
    built = load_objects(result.stdout)
    assert sorted(o["kind"] for o in built) == sorted(o["kind"] for o in plain)
    output = tmp_path / "built.yaml"
    output.write_text(result.stdout)
    assert_valid(built, output)


def test_plain_config_passes_dispatcher_check(plain: list[dict[str, Any]], tmp_path: Path) -> None:
    config = tmp_path / "dispatcher.yaml"
    config.write_text(the(plain, "ConfigMap")["data"]["dispatcher.yaml"])
    result = dispatcher_check(pod_check_env(the(plain, "Deployment")), config)
    assert result.returncode == 0, result.stderr
    assert "orders" in result.stdout


# --------------------------------------------------------------------------
# Same as the chart
# --------------------------------------------------------------------------


def _without_helm_bookkeeping(obj: dict[str, Any]) -> dict[str, Any]:
    clean = copy.deepcopy(obj)
    for metadata in (clean["metadata"], clean.get("spec", {}).get("template", {}).get("metadata")):
        if not metadata:
            continue
        for label in HELM_ONLY_LABELS:
            metadata.get("labels", {}).pop(label, None)
        for annotation in HELM_ONLY_ANNOTATIONS:
            metadata.get("annotations", {}).pop(annotation, None)
    return clean


def test_plain_manifests_equal_the_charts_default_render(plain: list[dict[str, Any]]) -> None:
    result = run_helm("template", "dispatcher", CHART, "--kube-version", "1.30.0")
    assert result.returncode == 0, result.stderr
    rendered = [_without_helm_bookkeeping(obj) for obj in load_objects(result.stdout)]
    assert sorted(o["kind"] for o in rendered) == sorted(o["kind"] for o in plain)
    for kind in ("Deployment", "Service", "ServiceAccount"):
        assert the(plain, kind) == the(rendered, kind), f"{kind} differs from the chart's"
    # The config file is compared as data: the plain one carries comments.
    plain_map, rendered_map = the(plain, "ConfigMap"), the(rendered, "ConfigMap")
    assert plain_map["metadata"] == rendered_map["metadata"]
    assert config_of(plain) == config_of(rendered)


# --------------------------------------------------------------------------
# The rules, on the plain files and on the drop-in
# --------------------------------------------------------------------------


def test_security_context(plain: list[dict[str, Any]], dropin: dict[str, Any]) -> None:
    for deployment in (the(plain, "Deployment"), dropin):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        security = container(deployment)["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["runAsNonRoot"] is True


def test_probes(plain: list[dict[str, Any]], dropin: dict[str, Any]) -> None:
    for deployment in (the(plain, "Deployment"), dropin):
        dispatcher = container(deployment)
        assert dispatcher["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
        assert dispatcher["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        assert dispatcher["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "9090"
        assert annotations["prometheus.io/path"] == "/metrics"


def test_termination_grace_is_shutdown_grace_plus_10s(plain: list[dict[str, Any]]) -> None:
    grace = parse_duration(config_of(plain)["shutdown"]["grace"], "shutdown.grace")
    pod = the(plain, "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == math.ceil(grace) + 10


def test_listener_env_matches_the_config(plain: list[dict[str, Any]]) -> None:
    env = env_of(container(the(plain, "Deployment")))
    assert env["DISPATCHER_LISTEN"]["value"] == config_of(plain)["http"]["listen"]


def test_broker_url_comes_only_from_the_secret(
    plain: list[dict[str, Any]], dropin: dict[str, Any]
) -> None:
    env = env_of(container(the(plain, "Deployment")))
    assert env["RABBITMQ_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "dispatcher-rabbitmq", "key": "url"}
    }
    assert "url" not in config_of(plain)["broker"]
    dropin_env = env_of(container(dropin))
    assert dropin_env["RABBIT_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "orders-trigger-rabbitmq", "key": "url"}
    }
    # Comments may show the URL's shape; the objects themselves never hold one.
    for text in strings_in([*plain, dropin]):
        assert "amqp://" not in text and "amqps://" not in text, text


# --------------------------------------------------------------------------
# Knative drop-in mode
# --------------------------------------------------------------------------


def test_dropin_uses_the_knative_variables_and_no_config_file(dropin: dict[str, Any]) -> None:
    dispatcher = container(dropin)
    env = env_of(dispatcher)
    assert set(env) >= KNATIVE_VARIABLES
    # Any config file turns drop-in mode off: the image carries none and the
    # manifest must not point at one.
    assert "DISPATCHER_CONFIG" not in env or not env["DISPATCHER_CONFIG"].get("value")
    assert "RABBITMQ_URL" not in env
    mounts = [m["mountPath"] for m in dispatcher.get("volumeMounts", [])]
    assert "/etc/dispatcher" not in mounts
    assert not [v for v in dropin["spec"]["template"]["spec"]["volumes"] if "configMap" in v]


def test_dropin_environment_gives_a_valid_binding(dropin: dict[str, Any], tmp_path: Path) -> None:
    """`dispatcher check` with the image's ENV and the manifest's, from an empty folder."""
    env = pod_check_env(dropin)
    assert env["RABBIT_URL"] == DUMMY_BROKER_URL
    result = dispatcher_check(env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    values = plain_values(env_of(container(dropin)))
    (binding,) = effective["bindings"]
    assert binding["queue"] == values["QUEUE_NAME"]
    assert binding["subscriber"] == values["SUBSCRIBER"]
    assert binding["parallelism"] == int(values["PARALLELISM"])
    assert binding["delivery"]["retry"] == int(values["RETRY"])
    assert binding["dead_letter"]["exchange"] == values["DLX_NAME"]
    assert binding["dead_letter"]["sink"] == values["DEAD_LETTER_SINK"]
    assert binding["reply"]["url"] == values["BROKER_INGRESS_URL"]
    grace = parse_duration(effective["shutdown"]["grace"], "shutdown.grace")
    assert dropin["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace + 10
