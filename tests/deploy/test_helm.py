"""The Helm chart in deploy/helm/dispatcher: lint, render, validate, and the rules it enforces.

Offline: helm comes from tests/support/helm.py, kubernetes-validate has its
schemas built in, and every rendered config goes through `dispatcher check`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import parse_duration
from tests.deploy.manifests import (
    CHART,
    DUMMY_BROKER_URL,
    DUMMY_STORE_URL,
    ROOT,
    assert_valid,
    config_of,
    container,
    dispatcher_check,
    env_of,
    load_objects,
    pod_check_env,
    strings_in,
    the,
    yaml_mapping,
)
from tests.support.helm import run_helm

pytestmark = pytest.mark.deploy

EXAMPLES = CHART / "examples"
# name -> (release name, values file or None for the chart's defaults)
VARIANTS: dict[str, tuple[str, Path | None]] = {
    "default": ("dispatcher", None),
    "sidecar": ("orders", EXAMPLES / "sidecar-values.yaml"),
    "everything": ("dispatcher", EXAMPLES / "everything-values.yaml"),
}
SCHEMA_ERROR = "values don't meet the specifications of the schema"
# A URL with a user (and so, usually, a password) in it.
CREDENTIALS_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s@]*@")


def helm_template(release: str, *args: str | Path) -> Any:
    return run_helm(
        "template", release, CHART, "--namespace", "events", "--kube-version", "1.30.0", *args
    )


def values_args(values: Path | None) -> list[str | Path]:
    return ["--values", values] if values else []


class Render:
    def __init__(self, name: str, text: str, path: Path) -> None:
        self.name = name
        self.text = text
        self.path = path
        self.objects = load_objects(text)
        self.values = self._values()

    def _values(self) -> dict[str, Any]:
        defaults = yaml_mapping((CHART / "values.yaml").read_text())
        file = VARIANTS[self.name][1]
        overrides = yaml_mapping(file.read_text()) if file else {}
        return _merge(defaults, overrides)

    @property
    def deployment(self) -> dict[str, Any]:
        return the(self.objects, "Deployment")

    @property
    def pod(self) -> dict[str, Any]:
        template: dict[str, Any] = self.deployment["spec"]["template"]
        return template

    @property
    def config(self) -> dict[str, Any]:
        return config_of(self.objects)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Helm's values merge: maps merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Render]:
    folder = tmp_path_factory.mktemp("rendered")
    out: dict[str, Render] = {}
    for name, (release, values) in VARIANTS.items():
        result = helm_template(release, *values_args(values))
        assert result.returncode == 0, f"helm template ({name}) failed:\n{result.stderr}"
        path = folder / f"{name}.yaml"
        path.write_text(result.stdout)
        out[name] = Render(name, result.stdout, path)
    return out


@pytest.fixture(params=sorted(VARIANTS))
def render(request: pytest.FixtureRequest, renders: dict[str, Render]) -> Render:
    return renders[request.param]


# --------------------------------------------------------------------------
# Lint and validate
# --------------------------------------------------------------------------


def test_examples_cover_sidecar_and_every_optional_object() -> None:
    assert {p.name for p in EXAMPLES.glob("*.yaml")} == {
        "sidecar-values.yaml",
        "everything-values.yaml",
    }


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict(variant: str) -> None:
    # --strict turns lint warnings into failures; lint renders NOTES.txt too.
    result = run_helm("lint", "--strict", CHART, *values_args(VARIANTS[variant][1]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_rendered_object_passes_kubernetes_validate(render: Render) -> None:
    assert_valid(render.objects, render.path)


def test_rendered_config_passes_dispatcher_check(render: Render, tmp_path: Path) -> None:
    config = tmp_path / "dispatcher.yaml"
    config.write_text(the(render.objects, "ConfigMap")["data"]["dispatcher.yaml"])
    result = dispatcher_check(pod_check_env(render.deployment), config)
    assert result.returncode == 0, result.stderr
    effective = yaml.safe_load(result.stdout)
    assert [b["name"] for b in effective["bindings"]] == [
        b["name"] for b in render.values["config"]["bindings"]
    ]


def test_service_example_config_is_accepted_by_the_schema(tmp_path: Path) -> None:
    """Every key of config/dispatcher.example.yaml (but broker.url) is valid chart config."""
    example = yaml.safe_load((ROOT / "config" / "dispatcher.example.yaml").read_text())
    del example["broker"]["url"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"config": example}))
    result = helm_template("dispatcher", "--values", values)
    assert result.returncode == 0, result.stderr
    objects = load_objects(result.stdout)
    rendered = config_of(objects)
    assert rendered == example


# --------------------------------------------------------------------------
# What the pod looks like
# --------------------------------------------------------------------------


def test_security_context(render: Render) -> None:
    pod_security = render.pod["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == 10001
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(render.deployment)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == 10001
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert render.pod["spec"]["automountServiceAccountToken"] is False


def test_probes_and_port(render: Render) -> None:
    dispatcher = container(render.deployment)
    assert dispatcher["ports"] == [{"name": "http", "containerPort": 9090, "protocol": "TCP"}]
    assert dispatcher["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert dispatcher["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    # The image's DISPATCHER_LISTEN would beat the file's http.listen: they must agree.
    assert env_of(dispatcher)["DISPATCHER_LISTEN"]["value"] == render.config["http"]["listen"]
    service = the(render.objects, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 9090, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == render.deployment["spec"]["selector"]["matchLabels"]


def test_termination_grace_is_shutdown_grace_plus_10s(render: Render) -> None:
    grace = parse_duration(render.config["shutdown"]["grace"], "shutdown.grace")
    expected = math.ceil(grace) + 10
    assert render.pod["spec"]["terminationGracePeriodSeconds"] == expected
    assert expected == {"default": 35, "sidecar": 40, "everything": 70}[render.name]


@pytest.mark.parametrize(
    ("grace", "seconds"),
    [("25s", 35), ("1m", 70), (45, 55), ("1m30s", 100), ("500ms", 11), ("2.5s", 13), (0, 10)],
)
def test_termination_grace_follows_any_grace_notation(grace: object, seconds: int) -> None:
    result = helm_template("dispatcher", "--set-json", f"config.shutdown.grace={json.dumps(grace)}")
    assert result.returncode == 0, result.stderr
    objects = load_objects(result.stdout)
    deployment = the(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == seconds
    config = config_of(objects)
    assert config["shutdown"]["grace"] == grace  # the file says what the values say


def test_broker_url_comes_only_from_the_secret(render: Render) -> None:
    secret = render.values["brokerSecret"]
    rabbitmq_url = env_of(container(render.deployment))["RABBITMQ_URL"]
    assert rabbitmq_url == {
        "name": "RABBITMQ_URL",
        "valueFrom": {"secretKeyRef": {"name": secret["name"], "key": secret["key"]}},
    }
    assert "url" not in render.config["broker"]
    assert "amqp://" not in render.text
    assert "amqps://" not in render.text


def test_config_is_mounted_read_only_and_named_by_dispatcher_config(render: Render) -> None:
    dispatcher = container(render.deployment)
    mount = next(m for m in dispatcher["volumeMounts"] if m["name"] == "config")
    assert mount == {"name": "config", "mountPath": "/etc/dispatcher", "readOnly": True}
    assert env_of(dispatcher)["DISPATCHER_CONFIG"]["value"] == "/etc/dispatcher/dispatcher.yaml"
    volume = next(v for v in render.pod["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == the(render.objects, "ConfigMap")["metadata"]["name"]


def test_scrape_annotations(renders: dict[str, Render]) -> None:
    annotations = renders["default"].pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert annotations["prometheus.io/path"] == "/metrics"
    # Turned off where the ServiceMonitor scrapes, so no pod is scraped twice.
    everything = renders["everything"].pod["metadata"]["annotations"]
    assert not any(key.startswith("prometheus.io/") for key in everything)


def test_config_change_rolls_the_pods() -> None:
    before = helm_template("dispatcher", "--show-only", "templates/deployment.yaml")
    after = helm_template(
        "dispatcher",
        "--show-only",
        "templates/deployment.yaml",
        "--set",
        "config.logging.level=debug",
    )
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr

    def checksum(text: str) -> str:
        pod = the(load_objects(text), "Deployment")["spec"]["template"]
        return str(pod["metadata"]["annotations"]["checksum/config"])

    assert checksum(before.stdout) != checksum(after.stdout)


# --------------------------------------------------------------------------
# Optional objects
# --------------------------------------------------------------------------


def test_default_render_has_no_optional_objects(renders: dict[str, Render]) -> None:
    kinds = sorted(obj["kind"] for obj in renders["default"].objects)
    assert kinds == ["ConfigMap", "Deployment", "Service", "ServiceAccount"]
    assert renders["default"].deployment["spec"]["replicas"] == 1


def test_everything_renders_every_optional_object(renders: dict[str, Render]) -> None:
    kinds = sorted(obj["kind"] for obj in renders["everything"].objects)
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "ScaledObject",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "TriggerAuthentication",
    ]


def test_service_monitor_scrapes_the_metrics_port(renders: dict[str, Render]) -> None:
    objects = renders["everything"].objects
    monitor = the(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["events"]}
    service_labels = the(objects, "Service")["metadata"]["labels"]
    for key, value in monitor["spec"]["selector"]["matchLabels"].items():
        assert service_labels[key] == value
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_disruption_budget(renders: dict[str, Render]) -> None:
    render = renders["everything"]
    pdb = the(render.objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"] == render.deployment["spec"]["selector"]
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def _keda(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The ScaledObject, its only trigger and the TriggerAuthentication it names."""
    scaled = the(objects, "ScaledObject")
    auth = the(objects, "TriggerAuthentication")
    assert scaled["apiVersion"] == auth["apiVersion"] == "keda.sh/v1alpha1"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "rabbitmq"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    # The host (a URL with credentials) only ever comes through the TriggerAuthentication.
    assert not {"host", "hostFromEnv", "username", "password"} & set(trigger["metadata"])
    return scaled, trigger, auth


def _host_from(auth: dict[str, Any], secret: dict[str, str]) -> None:
    assert auth["spec"] == {
        "secretTargetRef": [{"parameter": "host", "name": secret["name"], "key": secret["key"]}]
    }


def test_keda_scales_on_the_first_queue(renders: dict[str, Render]) -> None:
    render = renders["everything"]
    scaled, trigger, auth = _keda(render.objects)
    assert scaled["spec"]["scaleTargetRef"]["name"] == render.deployment["metadata"]["name"]
    assert trigger["metadata"]["mode"] == "QueueLength"
    assert trigger["metadata"]["value"] == "200"
    assert trigger["metadata"]["queueName"] == render.values["config"]["bindings"][0]["queue"]
    assert trigger["metadata"]["protocol"] == "http"
    _host_from(auth, render.values["keda"]["managementSecret"])
    # The HPA owns the replica count; a fixed one would fight it on every upgrade.
    assert "replicas" not in render.deployment["spec"]


def test_keda_counts_in_flight_messages_by_default() -> None:
    """Only keda.enabled set: the management API, unacked included, host from its Secret."""
    result = helm_template("dispatcher", "--set", "keda.enabled=true")
    assert result.returncode == 0, result.stderr
    _, trigger, auth = _keda(load_objects(result.stdout))
    # In-flight (unacked) messages count: busy replicas are not scaled away.
    assert trigger["metadata"]["protocol"] == "http"
    assert trigger["metadata"].get("excludeUnacknowledged", "false") == "false"
    defaults = yaml_mapping((CHART / "values.yaml").read_text())["keda"]
    assert defaults["protocol"] == "http"
    assert defaults["managementSecret"] == {"name": "dispatcher-rabbitmq-management", "key": "url"}
    _host_from(auth, defaults["managementSecret"])


def test_keda_amqp_stays_selectable() -> None:
    result = helm_template(
        "dispatcher", "--set", "keda.enabled=true", "--set", "keda.protocol=amqp"
    )
    assert result.returncode == 0, result.stderr
    _, trigger, auth = _keda(load_objects(result.stdout))
    assert trigger["metadata"]["protocol"] == "amqp"
    # KEDA refuses excludeUnacknowledged with amqp (it counts ready messages only anyway).
    assert "excludeUnacknowledged" not in trigger["metadata"]
    # AMQP needs the broker URL: the dispatcher's own Secret, not the management one.
    _host_from(auth, {"name": "dispatcher-rabbitmq", "key": "url"})


def test_values_say_why_http_is_the_default() -> None:
    text = (CHART / "values.yaml").read_text()
    keda = text[text.index("\nkeda:") :]
    for reference in ("#5050", "#6571", "unacked", "managementSecret"):
        assert reference in keda, reference


@pytest.mark.parametrize(
    ("values_file", "args"),
    [(None, []), (None, ["--set", "keda.enabled=true"]), (VARIANTS["everything"][1], [])],
    ids=["default", "keda-defaults", "everything"],
)
def test_no_credentials_in_values_or_rendered_objects(
    values_file: Path | None, args: list[str]
) -> None:
    values = [yaml_mapping((CHART / "values.yaml").read_text())]
    if values_file:
        values.append(yaml_mapping(values_file.read_text()))
    result = helm_template("dispatcher", *values_args(values_file), *args)
    assert result.returncode == 0, result.stderr
    for text in [*strings_in(values), *strings_in(load_objects(result.stdout))]:
        assert not CREDENTIALS_URL.search(text), text
    # Comments included: the rendered text shows no URL with a user either.
    assert not CREDENTIALS_URL.search(result.stdout)


def test_pdb_refuses_min_and_max_together() -> None:
    result = helm_template(
        "dispatcher",
        "--set",
        "podDisruptionBudget.enabled=true",
        "--set",
        "podDisruptionBudget.minAvailable=1",
    )
    assert result.returncode != 0
    assert "minAvailable or maxUnavailable" in result.stderr


# --------------------------------------------------------------------------
# Sidecar mode
# --------------------------------------------------------------------------


def test_sidecar_pod_runs_subscriber_and_dispatcher(renders: dict[str, Render]) -> None:
    render = renders["sidecar"]
    containers = render.pod["spec"]["containers"]
    assert [c["name"] for c in containers] == ["orders-app", "dispatcher"]
    subscriber = container(render.deployment, "orders-app")
    assert subscriber["image"] == "registry.example.com/orders-app:1.4.2"
    assert subscriber["ports"] == [{"name": "subscriber", "containerPort": 8080, "protocol": "TCP"}]
    assert subscriber["securityContext"]["allowPrivilegeEscalation"] is False
    for binding in render.config["bindings"]:
        assert binding["subscriber"] == "http://127.0.0.1:8080/events"


def test_sidecar_subscriber_outlives_the_dispatchers_grace(renders: dict[str, Render]) -> None:
    render = renders["sidecar"]
    subscriber = container(render.deployment, "orders-app")
    grace = parse_duration(render.config["shutdown"]["grace"], "shutdown.grace")
    assert subscriber["lifecycle"]["preStop"]["sleep"]["seconds"] == math.ceil(grace)
    assert render.pod["spec"]["terminationGracePeriodSeconds"] > math.ceil(grace)


def test_standalone_has_one_container(renders: dict[str, Render]) -> None:
    for name in ("default", "everything"):
        containers = renders[name].pod["spec"]["containers"]
        assert [c["name"] for c in containers] == ["dispatcher"]


def test_sidecar_port_must_differ_from_the_dispatchers() -> None:
    result = helm_template(
        "orders",
        "--values",
        EXAMPLES / "sidecar-values.yaml",
        "--set",
        "sidecar.subscriber.port=9090",
    )
    assert result.returncode != 0
    assert "sidecar.subscriber.port" in result.stderr


# --------------------------------------------------------------------------
# What the chart refuses
# --------------------------------------------------------------------------

BINDING = {"name": "orders", "queue": "orders", "subscriber": "http://subscriber/"}

BAD_VALUES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("negative-replicas", {"replicas": -1}, ["replicas"]),
    ("no-secret-name", {"brokerSecret": {"name": None}}, ["brokerSecret", "name is required"]),
    (
        "binding-without-queue",
        {"config": {"bindings": [{"name": "a", "subscriber": "http://s/"}]}},
        ["config.bindings.0", "queue is required"],
    ),
    (
        "binding-without-subscriber",
        {"config": {"bindings": [{"name": "a", "queue": "a"}]}},
        ["config.bindings.0", "subscriber is required"],
    ),
    (
        "bad-content-mode",
        {"config": {"bindings": [{**BINDING, "content_mode": "json"}]}},
        ["config.bindings.0.content_mode"],
    ),
    (
        "parallelism-zero",
        {"config": {"bindings": [{**BINDING, "parallelism": 0}]}},
        ["config.bindings.0.parallelism"],
    ),
    (
        "parallelism-too-high",
        {"config": {"bindings": [{**BINDING, "parallelism": 65536}]}},
        ["config.bindings.0.parallelism"],
    ),
    ("no-bindings", {"config": {"bindings": []}}, ["config.bindings"]),
    ("typo-in-key", {"replica": 2}, ["replica"]),
    (
        "unknown-config-key",
        {"config": {"bindings": [{**BINDING, "retries": 3}]}},
        ["config.bindings.0", "retries"],
    ),
    ("iso-grace", {"config": {"shutdown": {"grace": "PT25S"}}}, ["config.shutdown.grace"]),
    (
        "secret-url-in-extra-env",
        {"extraEnv": [{"name": "RABBITMQ_URL", "value": "x"}]},
        ["extraEnv.0.name"],
    ),
    (
        "store-url-in-extra-env",
        {"extraEnv": [{"name": "DEDUPE_STORE_URL", "value": "x"}]},
        ["extraEnv.0.name"],
    ),
    ("keda-host-in-values", {"keda": {"host": "http://x/"}}, ["keda", "host"]),
    ("keda-bad-protocol", {"keda": {"protocol": "mqtt"}}, ["keda.protocol"]),
    (
        "keda-management-secret-unnamed",
        {"keda": {"enabled": True, "managementSecret": {"name": ""}}},
        ["keda.managementSecret.name"],
    ),
    ("store-secret-bad-name", {"dedupeStoreSecret": {"name": "Redis_URL"}}, ["dedupeStoreSecret"]),
    ("bad-mode", {"mode": "daemonset"}, ["mode"]),
    (
        "sidecar-without-image",
        {"mode": "sidecar", "config": {"bindings": [{"name": "a", "queue": "a"}]}},
        ["sidecar.subscriber.image.repository"],
    ),
]


@pytest.mark.parametrize(
    ("values", "fields"), [case[1:] for case in BAD_VALUES], ids=[case[0] for case in BAD_VALUES]
)
def test_schema_rejects_bad_values(
    values: dict[str, Any], fields: list[str], tmp_path: Path
) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    result = helm_template("dispatcher", "--values", file)
    assert result.returncode != 0, f"rendered although invalid:\n{result.stdout}"
    assert SCHEMA_ERROR in result.stderr, result.stderr
    for field in fields:
        assert field in result.stderr, f"{field!r} not named in:\n{result.stderr}"


@pytest.mark.parametrize("skip_schema", [False, True], ids=["with-schema", "template-alone"])
@pytest.mark.parametrize(
    ("section", "key", "value", "secret"),
    [
        ("broker", "url", DUMMY_BROKER_URL, "brokerSecret"),
        ("dedupe", "store", DUMMY_STORE_URL, "dedupeStoreSecret"),
        ("dedupe", "store", "", "dedupeStoreSecret"),
    ],
    ids=["broker.url", "dedupe.store", "dedupe.store-empty"],
)
def test_a_url_with_a_password_in_values_is_refused(
    skip_schema: bool, section: str, key: str, value: str, secret: str, tmp_path: Path
) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"config": {section: {key: value}}}))
    extra = ["--skip-schema-validation"] if skip_schema else []
    result = helm_template("dispatcher", "--values", file, *extra)
    assert result.returncode != 0, result.stdout
    assert f"config.{section}.{key} must not be set" in result.stderr
    assert secret in result.stderr
    assert "not-a-secret" not in result.stderr + result.stdout


def test_dedupe_store_null_is_the_services_default(tmp_path: Path) -> None:
    # null (no store) carries no password; the service's example may spell it out.
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"config": {"dedupe": {"store": None}}}))
    result = helm_template("dispatcher", "--values", file)
    assert result.returncode == 0, result.stderr
    objects = load_objects(result.stdout)
    assert config_of(objects)["dedupe"] == {"store": None}
    assert "DEDUPE_STORE_URL" not in env_of(container(the(objects, "Deployment")))


def test_dedupe_store_comes_only_from_its_secret(renders: dict[str, Render]) -> None:
    assert "DEDUPE_STORE_URL" not in env_of(container(renders["default"].deployment))
    render = renders["everything"]
    secret = render.values["dedupeStoreSecret"]
    assert secret["name"]
    assert env_of(container(render.deployment))["DEDUPE_STORE_URL"] == {
        "name": "DEDUPE_STORE_URL",
        "valueFrom": {"secretKeyRef": {"name": secret["name"], "key": secret["key"]}},
    }
    assert "store" not in (render.config.get("dedupe") or {})
    result = helm_template(
        "dispatcher", "--set", "dedupeStoreSecret.name=redis", "--set", "dedupeStoreSecret.key=u"
    )
    assert result.returncode == 0, result.stderr
    env = env_of(container(the(load_objects(result.stdout), "Deployment")))
    assert env["DEDUPE_STORE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "redis", "key": "u"}}


def test_dedupe_store_secret_reaches_the_service(
    renders: dict[str, Render], tmp_path: Path
) -> None:
    """`dispatcher check` with the pod's env sees the Secret's URL as dedupe.store."""
    render = renders["everything"]
    config = tmp_path / "dispatcher.yaml"
    config.write_text(the(render.objects, "ConfigMap")["data"]["dispatcher.yaml"])
    env = pod_check_env(render.deployment)
    assert env["DEDUPE_STORE_URL"] == DUMMY_STORE_URL
    result = dispatcher_check(env, config)
    assert result.returncode == 0, result.stderr
    store = yaml.safe_load(result.stdout)["dedupe"]["store"]
    assert store.startswith("redis://") and "store.invalid" in store
    assert "not-a-secret" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"shutdown": {"grace": "PT25S"}}}, "config.shutdown.grace"),
        ({"config": {"http": {"listen": "127.0.0.1:9090"}}}, "config.http.listen"),
        ({"config": {"http": {"listen": "0.0.0.0:0"}}}, "config.http.listen"),
        ({"brokerSecret": {"name": ""}}, "brokerSecret.name"),
        ({"keda": {"enabled": True, "protocol": "mqtt"}}, "keda.protocol"),
        (
            {"keda": {"enabled": True, "managementSecret": {"name": ""}}},
            "keda.managementSecret.name is required with keda.protocol: http",
        ),
    ],
    ids=[
        "iso-grace",
        "loopback-listen",
        "port-zero",
        "empty-secret-name",
        "keda-bad-protocol",
        "keda-unnamed-management-secret",
    ],
)
def test_template_guards_hold_without_the_schema(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    # `helm template --skip-schema-validation` and charts embedding this one as
    # a subchart with schema checks off still must not render a broken pod.
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    result = helm_template("dispatcher", "--values", file, "--skip-schema-validation")
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr


def test_listen_port_drives_every_port(tmp_path: Path) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump({"config": {"http": {"listen": "0.0.0.0:9102"}}}))
    result = helm_template("dispatcher", "--values", file)
    assert result.returncode == 0, result.stderr
    objects = load_objects(result.stdout)
    deployment = the(objects, "Deployment")
    dispatcher = container(deployment)
    assert dispatcher["ports"][0]["containerPort"] == 9102
    assert env_of(dispatcher)["DISPATCHER_LISTEN"]["value"] == "0.0.0.0:9102"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9102"
    assert the(objects, "Service")["spec"]["ports"][0]["port"] == 9102
