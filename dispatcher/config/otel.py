"""The standard OpenTelemetry variables over the ``tracing`` section.

Read as the OpenTelemetry specification says (``OTEL_SDK_DISABLED``,
``OTEL_EXPORTER_OTLP_ENDPOINT`` and ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``,
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` with ``OTEL_TRACES_SAMPLER_ARG``),
and applied like every other variable: before validation, so that a bad value
is a ``ConfigError`` naming the variable, in ``check`` as in ``run``. Setting
an endpoint variable turns tracing on; ``OTEL_SDK_DISABLED=true`` turns it off
whatever the file says. ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_EXPORTER_OTLP_HEADERS`` are the SDK's own to read.

Sampling is always parent-based (a sampled parent is followed, an unsampled
one is not): ``always_on``, ``always_off`` and ``traceidratio`` are read as
their ``parentbased_`` forms, which set the ratio for messages that arrive
without a trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from dispatcher.config import urls
from dispatcher.config.redaction import show
from dispatcher.config.settings import TracingSettings
from dispatcher.errors import ConfigError

TRACES_ENDPOINT: Final = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT: Final = "OTEL_EXPORTER_OTLP_ENDPOINT"

# OTEL_TRACES_SAMPLER -> the ratio for root spans; None: OTEL_TRACES_SAMPLER_ARG's.
_SAMPLERS: Final[Mapping[str, float | None]] = {
    "always_on": 1.0,
    "always_off": 0.0,
    "traceidratio": None,
    "parentbased_always_on": 1.0,
    "parentbased_always_off": 0.0,
    "parentbased_traceidratio": None,
}


def overrides(environ: Mapping[str, str]) -> tuple[dict[str, object], dict[str, str]]:
    """The ``tracing`` keys the variables set, and which variable set each."""
    keys: dict[str, object] = {}
    origins: dict[str, str] = {}

    def put(key: str, value: object, variable: str) -> None:
        keys[key] = value
        origins[f"tracing.{key}"] = variable

    for variable in (TRACES_ENDPOINT, ENDPOINT):
        if environ.get(variable):
            put("enabled", True, variable)
    if environ.get(ENDPOINT):
        put("endpoint", environ[ENDPOINT], ENDPOINT)
    if environ.get("OTEL_SERVICE_NAME"):
        put("service_name", environ["OTEL_SERVICE_NAME"], "OTEL_SERVICE_NAME")
    sampler = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if sampler:
        if sampler not in _SAMPLERS:
            raise ConfigError(
                "OTEL_TRACES_SAMPLER", f"must be one of {', '.join(_SAMPLERS)}, got {show(sampler)}"
            )
        ratio = _SAMPLERS[sampler]
        if ratio is None:
            put(
                "sample_ratio",
                _number(environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")),
                "OTEL_TRACES_SAMPLER_ARG",
            )
        else:
            put("sample_ratio", ratio, "OTEL_TRACES_SAMPLER")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        put("enabled", False, "OTEL_SDK_DISABLED")
    return keys, origins


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text  # the rule says what is wrong with it


def traces_url(tracing: TracingSettings, environ: Mapping[str, str]) -> str:
    """Where spans are posted: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as it is
    written, else the base endpoint with ``/v1/traces``. Raises ``ConfigError``
    naming the variable for a URL that is not one."""
    signal = environ.get(TRACES_ENDPOINT)
    if signal:
        return urls.http_url(signal, TRACES_ENDPOINT)
    return tracing.traces_url
