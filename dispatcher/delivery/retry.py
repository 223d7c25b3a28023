"""Where retries are decided and scheduled: which answers are retried, and how long to wait.

Which statuses are retried is a binding's ``delivery.retry_on`` (statuses and
the classes ``4xx``/``5xx``), by default 404, 408, 409, 429 and 5xx. Timeouts and
connection errors are always retried; any other non-2xx goes to the dead-letter
path at once; 2xx is success. A status outside 100-599 belongs to no class
HTTP defines: it counts as 5xx (a 500), as Knative's data plane asks for
codes it does not list, so it is retried like a server error. A ``Retry-After`` is read by libcurl
(``Response.retry_after``) and honoured here, capped at ``backoff_max``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

# How waits grow (``delivery.backoff_policy``). This module owns the policies and
# their defaults; the configuration imports them, never the other way round.
BackoffPolicy = Literal["exponential", "linear"]

# ``delivery.retry_on`` when the config says nothing: Knative's and our table.
DEFAULT_RETRY_ON: Final[tuple[int | str, ...]] = (404, 408, 409, 429, "5xx")
RETRY_CLASSES: Final = ("4xx", "5xx")
# Each wait is scaled by a random factor in [1 - JITTER, 1 + JITTER] so that
# many dispatchers retrying after one outage do not arrive in lock-step.
JITTER = 0.2


class Decision(Enum):
    """What an attempt's answer means for the delivery."""

    SUCCESS = "success"
    RETRY = "retry"
    FAIL = "fail"  # not retryable: dead-letter at once


def retried_statuses(retry_on: Iterable[int | str]) -> frozenset[int]:
    """Every status ``retry_on`` retries, its classes spelled out: one set lookup
    per answer. Entries are as the config validated them (100-599, not 2xx;
    ``4xx`` or ``5xx`` in either case)."""
    statuses: set[int] = set()
    for entry in retry_on:
        if isinstance(entry, str):
            first = int(entry[0]) * 100
            statuses.update(range(first, first + 100))
        else:
            statuses.add(entry)
    return frozenset(statuses)


DEFAULT_RETRIED: Final = retried_statuses(DEFAULT_RETRY_ON)


def classify(status: int | None, retried: frozenset[int] = DEFAULT_RETRIED) -> Decision:
    """Decision for an HTTP status; ``None`` (no status: a timeout or transport
    error) is always retried. ``retried``: ``retried_statuses`` of the binding's
    ``retry_on``."""
    if status is None:
        return Decision.RETRY
    if 200 <= status < 300:
        return Decision.SUCCESS
    if not 100 <= status <= 599:
        status = 500  # no HTTP class: a server that answers so is broken, as with a 500
    return Decision.RETRY if status in retried else Decision.FAIL


@dataclass(frozen=True, slots=True)
class Backoff:
    """Knative's DeliverySpec backoff: ``delay * 2**n`` or ``delay * (n + 1)``, capped."""

    policy: BackoffPolicy
    delay: float
    maximum: float
    rng: Callable[[], float] = random.random
    jitter: float = JITTER

    def base(self, retry_number: int) -> float:
        """Un-jittered wait before retry ``retry_number`` (0 = the first retry)."""
        if self.policy == "linear":
            raw = self.delay * (retry_number + 1)
        else:
            # Capping the exponent keeps the float finite for absurd retry counts.
            raw = self.delay * (2.0 ** min(retry_number, 62))
        return min(raw, self.maximum)

    def wait(self, retry_number: int, retry_after: float | None = None) -> float:
        spread = self.jitter
        jittered = self.base(retry_number) * (1.0 - spread + 2.0 * spread * self.rng())
        if retry_after is not None:
            # The subscriber asked for a pause: honour it, but never beyond our cap.
            jittered = max(jittered, min(retry_after, self.maximum))
        return min(jittered, self.maximum)
