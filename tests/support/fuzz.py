"""The one hypothesis set-up of the suite's property tests.

A fixed number of examples per test, ``derandomize=True`` and no example
database: CI meets the same inputs on every run, on every machine, so a
failure reproduces from its log and is never a flake. No deadline: a slow
shared machine must not turn into a failing test. ``FUZZ_EXAMPLES=N`` raises
the count for a local campaign (the inputs are still one fixed sequence).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, settings


def examples(default: int) -> int:
    """Examples per test: ``FUZZ_EXAMPLES`` if set, else ``default``."""
    return int(os.environ.get("FUZZ_EXAMPLES", default))


def fuzz_settings(
    default_examples: int,
    suppress: Iterable[HealthCheck] = (HealthCheck.too_slow,),
    **extra: Any,
) -> settings:
    return settings(
        max_examples=examples(default_examples),
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(suppress),
        **extra,
    )
