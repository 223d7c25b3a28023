"""The ``tracing`` section, the standard OTEL_* variables over it, and Knative's
observability configuration in drop-in mode."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.config import TracingSettings, advice, render_effective_config
from dispatcher.config import settings_from_dict as load
from dispatcher.config.knative import raw_config
from dispatcher.config.otel import traces_url
from dispatcher.errors import ConfigError

BINDINGS = {"bindings": [{"name": "a", "queue": "q", "subscriber": "http://s/"}]}


def tracing(env: dict[str, str] | None = None, **section: Any) -> TracingSettings:
    raw = {**BINDINGS, "tracing": section} if section else BINDINGS
    return load(raw, env or {}).tracing


def refused(env: dict[str, str] | None = None, **section: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        tracing(env, **section)
    return str(caught.value)


def test_off_by_default_with_the_contract_s_defaults():
    assert tracing() == TracingSettings(
        enabled=False, endpoint="http://127.0.0.1:4318", sample_ratio=1.0, service_name="dispatcher"
    )
    assert tracing().traces_url == "http://127.0.0.1:4318/v1/traces"


def test_the_file_s_values():
    t = tracing(
        enabled=True, endpoint="https://c.example/otlp/", sample_ratio=0.5, service_name="x"
    )
    assert t == TracingSettings(
        enabled=True, endpoint="https://c.example/otlp/", sample_ratio=0.5, service_name="x"
    )
    assert t.traces_url == "https://c.example/otlp/v1/traces"


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"enabled": "yes"}, "tracing.enabled: must be a boolean"),
        ({"endpoint": "grpc://c:4317"}, "tracing.endpoint: must be an http(s) URL"),
        ({"sample_ratio": 1.5}, "tracing.sample_ratio: must be <= 1"),
        ({"sample_ratio": -0.1}, "tracing.sample_ratio: must be >= 0"),
        ({"sample_ratio": "0.5"}, "tracing.sample_ratio: must be a number"),
        ({"service_name": ""}, "tracing.service_name: must not be empty"),
        ({"exporter": "otlp"}, "tracing.exporter: unknown key"),
    ],
)
def test_bad_values_name_their_key(section, problem):
    assert refused(**section).startswith(problem)


def test_an_endpoint_variable_turns_tracing_on():
    t = tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert (t.enabled, t.traces_url) == (True, "http://collector:4318/v1/traces")
    signal = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:9999/custom/path"}
    t = tracing(signal)
    assert t.enabled
    # The signal's own endpoint is used as it is written, as the specification says.
    assert traces_url(t, signal) == "http://collector:9999/custom/path"


def test_check_says_the_endpoint_is_not_used_when_the_signal_s_own_variable_is_set():
    """``check`` printed ``tracing.endpoint`` and nothing else: a user who edited it
    saw no effect, since spans went to the signal's endpoint."""
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://user:secret@c:9999/custom"}
    said = [str(a) for a in advice(load(BINDINGS, env), env) if a.key == "tracing.endpoint"]
    assert said == [
        "tracing.endpoint: is not used: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT sends the spans "
        "to http://user:***@c:9999/custom"
    ]
    off = {**env, "OTEL_SDK_DISABLED": "true"}
    assert not [a for a in advice(load(BINDINGS, off), off) if a.key == "tracing.endpoint"]


def test_otel_sdk_disabled_wins_over_the_file_and_the_endpoint():
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}
    assert not tracing(env, enabled=True).enabled
    assert tracing({"OTEL_SDK_DISABLED": "false"}, enabled=True).enabled


def test_service_name_and_sampler_variables():
    env = {
        "OTEL_SERVICE_NAME": "orders-dispatcher",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.25",
    }
    t = tracing(env, sample_ratio=1.0, service_name="file")
    assert (t.service_name, t.sample_ratio) == ("orders-dispatcher", 0.25)
    for sampler, ratio in [("always_off", 0.0), ("parentbased_always_on", 1.0)]:
        assert tracing({"OTEL_TRACES_SAMPLER": sampler}, sample_ratio=0.5).sample_ratio == ratio
    # traceidratio without an argument: the specification's default, 1.0.
    assert tracing({"OTEL_TRACES_SAMPLER": "traceidratio"}, sample_ratio=0.5).sample_ratio == 1.0


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"OTEL_TRACES_SAMPLER": "jaeger_remote"}, "OTEL_TRACES_SAMPLER: must be one of"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG: must be a number",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "OTEL_TRACES_SAMPLER_ARG: must be <= 1",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT: "),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://a b/"}, "OTEL_EXPORTER_OTLP_TRACES_END"),
    ],
)
def test_bad_variables_are_refused_naming_the_variable(env, problem):
    assert refused(env).startswith(problem)


def test_check_shows_the_section():
    rendered = render_effective_config(load({**BINDINGS, "tracing": {"enabled": True}}, {}))
    assert (
        "tracing:\n  enabled: true\n  endpoint: http://127.0.0.1:4318\n"
        "  sample_ratio: 1\n  service_name: dispatcher\n"
    ) in rendered


def test_check_never_shows_an_endpoint_s_password():
    raw = {**BINDINGS, "tracing": {"endpoint": "https://u:hunter2@c.example:4318"}}
    assert "hunter2" not in render_effective_config(load(raw, {}))


KNATIVE = {"QUEUE_NAME": "q", "RABBIT_URL": "amqp://guest:guest@h/", "SUBSCRIBER": "http://s/"}


def knative(observability: object) -> TracingSettings:
    env = {**KNATIVE, "K_OBSERVABILITY_CONFIG": json.dumps(observability)}
    return load(raw_config(env), {}).tracing


def test_knative_s_http_protobuf_tracing_maps():
    t = knative(
        {
            "tracing": {
                "protocol": "http/protobuf",
                "endpoint": "http://jaeger-collector.observability:4318/v1/traces",
                "samplingRate": 0.1,
            },
            "metrics": {"protocol": "none"},
        }
    )
    assert t == TracingSettings(
        enabled=True, endpoint="http://jaeger-collector.observability:4318", sample_ratio=0.1
    )
    assert t.traces_url == "http://jaeger-collector.observability:4318/v1/traces"


def test_knative_s_rate_is_clamped_and_a_bare_host_is_https_as_knative_reads_it():
    t = knative({"tracing": {"protocol": "http/protobuf", "endpoint": "c:4318", "samplingRate": 5}})
    assert (t.endpoint, t.sample_ratio) == ("https://c:4318", 1.0)
    t = knative({"tracing": {"protocol": "http/protobuf", "endpoint": "http://c:4318"}})
    assert t.sample_ratio == 0.0  # left out: Knative never samples


@pytest.mark.parametrize("protocol", ["none", "grpc", "stdout", None])
def test_knative_protocols_not_spoken_here_leave_tracing_off(protocol):
    assert not knative({"tracing": {"protocol": protocol, "endpoint": "c:4317"}}).enabled
    assert not knative({}).enabled


@pytest.mark.parametrize("protocol", ["grpc", "stdout"])
def test_a_knative_protocol_not_spoken_here_is_said_once_tracing_stays_off(protocol):
    env = {**KNATIVE, "K_OBSERVABILITY_CONFIG": json.dumps({"tracing": {"protocol": protocol}})}
    said = [a for a in advice(load(raw_config(env), env), env) if a.key == "K_OBSERVABILITY_CONFIG"]
    assert [a.text for a in said] == [
        f"asks for tracing over {protocol}, which this dispatcher does not speak "
        "(only http/protobuf): tracing is off"
    ]
    # The OTEL_* variables turned it on after all: nothing to say.
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://c:4318"
    assert load(raw_config(env), env).tracing.enabled
    assert not [a for a in advice(load(raw_config(env), env), env) if "tracing" in a.text]


@pytest.mark.parametrize("protocol", ["http/protobuf", "none", None])
def test_knative_protocols_it_speaks_or_that_ask_for_nothing_are_not_remarked(protocol):
    observability = {"tracing": {"protocol": protocol, "endpoint": "http://c:4318"}}
    env = {**KNATIVE, "K_OBSERVABILITY_CONFIG": json.dumps(observability)}
    assert not [a for a in advice(load(raw_config(env), env), env) if "tracing" in a.text]


def test_a_broken_knative_observability_config_names_the_variable():
    env = {**KNATIVE, "K_OBSERVABILITY_CONFIG": "{not json"}
    with pytest.raises(ConfigError) as caught:
        raw_config(env)
    assert str(caught.value).startswith("K_OBSERVABILITY_CONFIG: must be a JSON object")
    with pytest.raises(ConfigError) as caught:
        knative({"tracing": {"protocol": "http/protobuf"}})
    assert "tracing.endpoint is required" in str(caught.value)
