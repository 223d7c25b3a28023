"""How a message ended, in the contract's words: the ``outcome`` field of a
delivery line, the ``outcome`` label of ``dispatcher_events_total``, and the
``dispatcher.outcome`` attribute of a message's span."""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Outcome(StrEnum):
    """How a message ended, as the contract names it: the ``outcome`` field of a
    delivery log line and label of ``dispatcher_events_total`` (the first five),
    and ``dispatcher.outcome`` of its span (all of them)."""

    DELIVERED = "delivered"
    DEAD_LETTERED = "dead_lettered"
    REQUEUED = "requeued"
    REJECTED = "rejected"
    FILTERED = "filtered"
    # Spans only: no delivery line is written for these.
    DUPLICATE = "duplicate"  # a redelivery of an event already delivered: acked unsent
    LEFT = "left"  # shutdown or a closed channel: left for the broker to redeliver
    ERROR = "error"  # the handler itself failed (the message is given back)


# The outcomes a delivery line and the events counter name.
LOGGED_OUTCOMES: Final = (
    Outcome.DELIVERED,
    Outcome.DEAD_LETTERED,
    Outcome.REQUEUED,
    Outcome.REJECTED,
    Outcome.FILTERED,
)
