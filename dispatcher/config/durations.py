"""Durations: ``250ms``, ``1.5s``, ``1m30s``, ``PT0.25S``, ``P1DT2H`` or a number of seconds.

Go-style units are read because Kubernetes manifests and Knative write them
(Knative's ``BACKOFF_DELAY`` may be ``500µs``, as Go's ``time.Duration``
prints it); ISO-8601 because other tools do. Years and months have no fixed
length and are refused. The regular expressions are public because
``validation`` builds the JSON Schema's duration pattern from them.
"""

from __future__ import annotations

import math
import re
from typing import Final

from dispatcher.config.redaction import show
from dispatcher.errors import ConfigError

_DURATION_HELP: Final = "(use 250ms, 1.5s, 2m, PT0.25S or seconds)"
NUMBER: Final = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_BARE_SECONDS: Final = re.compile(NUMBER)
# Go-style, so "1m30s" works as it does in Kubernetes manifests, and "500µs"
# as Knative writes its BACKOFF_DELAY (Go's time.Duration.String()).
_GO_UNITS: Final = r"ns|us|µs|μs|ms|s|m|h"
_UNIT_PART: Final = re.compile(rf"({NUMBER})({_GO_UNITS})")
UNIT_DURATION: Final = re.compile(rf"(?:{NUMBER}(?:{_GO_UNITS}))+")
_ISO_NUMBER: Final = r"[0-9]+(?:[.,][0-9]+)?"
ISO_DURATION: Final = re.compile(
    rf"P(?:(?P<W>{_ISO_NUMBER})W)?(?:(?P<D>{_ISO_NUMBER})D)?"
    rf"(?:T(?:(?P<H>{_ISO_NUMBER})H)?(?:(?P<M>{_ISO_NUMBER})M)?(?:(?P<S>{_ISO_NUMBER})S)?)?"
)
_ISO_CALENDAR: Final = re.compile(r"P[^T]*[YM]")
_UNIT_SECONDS: Final = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_ISO_SECONDS: Final = {"W": 604800.0, "D": 86400.0, "H": 3600.0, "M": 60.0, "S": 1.0}
# Longer is never meant, and the values reach bounded C types (a thread's wait
# holds at most 292 years, libcurl's timeout a long of milliseconds): past them
# ``check`` said valid and ``run`` crashed at SIGTERM or failed every delivery.
LONGEST: Final = 3650 * 86400.0  # ten years


def parse_duration(value: object, key: str) -> float:
    """Seconds from ``250ms``, ``1.5s``, ``1m30s``, ``PT0.25S``, ``P1DT2H`` or a number.

    Raises ``ConfigError(key, ...)`` for anything else, negative or non-finite.
    """
    try:
        seconds = _duration_seconds(value, key)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds):
        raise ConfigError(key, f"must be a finite duration, got {show(value)}")
    if seconds < 0:
        raise ConfigError(key, "must be >= 0")
    if seconds > LONGEST:
        raise ConfigError(key, f"must be at most 3650 days (ten years), got {show(value)}")
    return seconds + 0.0  # turns "-0s" into 0.0, not -0.0


def positive_duration(value: object, key: str) -> float:
    seconds = parse_duration(value, key)
    if seconds <= 0:
        raise ConfigError(key, "must be > 0")
    return seconds


def heartbeat(value: object, key: str) -> float:
    """``broker.heartbeat``: 1 s to the AMQP limit."""
    seconds = parse_duration(value, key)
    if seconds < 1:
        # 0 would turn heartbeats off (as RabbitMQ allows): then a silently dropped
        # connection is never noticed, consumption stops for good and a publish
        # waits for its confirm forever. Not offered.
        raise ConfigError(key, "must be at least 1s (heartbeats detect silent connections)")
    if seconds > 65535:
        raise ConfigError(key, "must be at most 65535s (the AMQP limit)")
    return seconds


def _duration_seconds(value: object, key: str) -> float:
    if isinstance(value, bool) or value is None:
        raise ConfigError(key, f"invalid duration {show(value)} {_DURATION_HELP}")
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a duration {_DURATION_HELP}, got {show(value)}")
    text = value.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("-", "+") else text
    if _BARE_SECONDS.fullmatch(body):
        return sign * float(body)
    if UNIT_DURATION.fullmatch(body):
        return sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in _UNIT_PART.findall(body))
    iso = _iso_seconds(body)
    if iso is not None:
        return sign * iso
    if _ISO_CALENDAR.match(body):
        raise ConfigError(
            key,
            f"invalid duration {show(value)}: ISO-8601 years and months have no fixed "
            "length; use days (P1D) or smaller units",
        )
    raise ConfigError(key, f"invalid duration {show(value)} {_DURATION_HELP}")


def _iso_seconds(text: str) -> float | None:
    match = ISO_DURATION.fullmatch(text)
    if match is None:
        return None
    parts = {unit: number for unit, number in match.groupdict().items() if number is not None}
    # "P" and "PT" match the pattern but say nothing; "P1DT" has a dangling T.
    time_given = any(unit in parts for unit in "HMS")
    if not parts or ("T" in text and not time_given):
        return None
    return sum(float(number.replace(",", ".")) * _ISO_SECONDS[u] for u, number in parts.items())
