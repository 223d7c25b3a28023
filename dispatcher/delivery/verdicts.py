"""What the subscriber's answers decided for an event, kept for its redelivery.

A delivery's fate is decided by the subscriber's answers, then carried out by
publishes: the dead letter (to the sink or exchange), or the reply, then the
ack. When the carrying out fails (every dead-letter target failed, a confirm
lost with its connection, shutdown), the message goes back to the broker, but
the decision was already made. A redelivery of it carries that same decision
out again instead of asking the subscriber once more: the dead-letter queue or
the reply exchange may get a second copy, the subscriber never a second
request (docs/guarantees.md). Deciding afresh would send the event again, and
an event that the subscriber takes the second time would end both delivered
and dead-lettered.

A ``Verdict`` is remembered where settlements are (``dedupe``): in memory for
``dedupe_window``, bounded in count and bytes, and in the shared store when
there is one, since the redelivery may reach another replica (``encode`` and
``decode`` are its form there). Only a redelivery follows one: a first
delivery with the same id is a publisher's other copy, the subscriber's to
judge.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from dispatcher.event.cloudevent import Event, Key

DEFAULT_CAPACITY: Final = 10_000
# A reply verdict holds a whole reply event (up to max_body_size): the memory of
# them all is bounded by its bytes too, the oldest forgotten first.
DEFAULT_BYTES: Final = 64 * 1024 * 1024
_FORMAT: Final = 1
# What of an answer's body a dead letter carries (``knativeerrordata``, at most
# 1024 base64 characters): 768 bytes are exactly that.
ERROR_DATA_BYTES: Final = 1024 // 4 * 3


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an event is being dead-lettered."""

    # The last HTTP status; None: no answer (a timeout, a transport error) or our own decision.
    code: int | None
    body: bytes = b""
    reason: str | None = None
    destination: str | None = None  # whose answer ``code`` and ``body`` are; None: the subscriber's


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Dead-letter it with ``failure`` (reject it where there is no dead-letter
    target). ``status``: the subscriber's last, for the delivery line."""

    failure: Failure
    status: int | None


@dataclass(frozen=True, slots=True)
class ForwardReply:
    """Forward ``reply`` (found in the subscriber's 2xx, ``status``), then ack."""

    reply: Event
    status: int


Verdict = DeadLetter | ForwardReply


def dead_letter(failure: Failure, status: int | None) -> DeadLetter:
    """The verdict, with only as much of the answer's body as a dead letter carries."""
    if len(failure.body) > ERROR_DATA_BYTES:
        failure = Failure(
            failure.code, failure.body[:ERROR_DATA_BYTES], failure.reason, failure.destination
        )
    return DeadLetter(failure, status)


def size(verdict: Verdict) -> int:
    """Roughly the bytes it holds: what the memory's byte bound counts."""
    if isinstance(verdict, DeadLetter):
        failure = verdict.failure
        return 64 + len(failure.body) + len(failure.reason or "") + len(failure.destination or "")
    reply = verdict.reply
    return 64 + len(reply.data or b"") + sum(len(k) + len(v) for k, v in reply.attributes.items())


def encode(verdict: Verdict) -> bytes:
    """The verdict as the shared store keeps it (ASCII JSON: a lone surrogate in an
    attribute is escaped, not an encoding error)."""
    document: dict[str, Any]
    if isinstance(verdict, DeadLetter):
        failure = verdict.failure
        document = {
            "kind": "dead_letter",
            "status": verdict.status,
            "code": failure.code,
            "body": base64.b64encode(failure.body).decode("ascii"),
            "reason": failure.reason,
            "destination": failure.destination,
        }
    else:
        reply = verdict.reply
        data = None if reply.data is None else base64.b64encode(reply.data).decode("ascii")
        document = {
            "kind": "reply",
            "status": verdict.status,
            "attributes": dict(reply.attributes),
            "data": data,
        }
    document["format"] = _FORMAT
    return json.dumps(document, separators=(",", ":")).encode("ascii")


def decode(payload: bytes) -> Verdict | None:
    """The verdict ``encode`` wrote; None for anything else (another version's
    form, a damaged value): then the redelivery decides afresh."""
    try:
        document = json.loads(payload)
        if document.get("format") != _FORMAT:
            return None
        if document["kind"] == "dead_letter":
            failure = Failure(
                _optional_int(document["code"]),
                base64.b64decode(document["body"], validate=True),
                _optional_str(document["reason"]),
                _optional_str(document["destination"]),
            )
            return DeadLetter(failure, _optional_int(document["status"]))
        if document["kind"] == "reply":
            attributes = document["attributes"]
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()):
                return None
            data = document["data"]
            raw = None if data is None else base64.b64decode(data, validate=True)
            return ForwardReply(Event(attributes, raw), int(document["status"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return None


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("not an integer")
    return value


def _optional_str(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise TypeError("not a string")
    return value


class VerdictMemory:
    """One binding's remembered verdicts, each for ``window`` seconds, at most
    ``capacity`` of them and ``max_bytes`` in all, oldest forgotten first.
    Loop thread only: no locks."""

    def __init__(
        self,
        window: float,
        clock: Callable[[], float],
        capacity: int = DEFAULT_CAPACITY,
        max_bytes: int = DEFAULT_BYTES,
    ) -> None:
        self._window = window
        self._clock = clock
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._kept: OrderedDict[Key, tuple[Verdict, float, int]] = OrderedDict()

    def remember(self, key: Key, verdict: Verdict) -> None:
        self.forget(key)
        held = size(verdict)
        if held > self._max_bytes:
            return  # larger than the whole memory: decided afresh if it comes back
        self._kept[key] = (verdict, self._clock() + self._window, held)
        self._bytes += held
        while len(self._kept) > self._capacity or self._bytes > self._max_bytes:
            _key, (_verdict, _expiry, dropped) = self._kept.popitem(last=False)
            self._bytes -= dropped

    def get(self, key: Key) -> Verdict | None:
        self._expire()
        kept = self._kept.get(key)
        return None if kept is None else kept[0]

    def forget(self, key: Key) -> None:
        if self._kept:
            kept = self._kept.pop(key, None)
            if kept is not None:
                self._bytes -= kept[2]

    def __len__(self) -> int:
        return len(self._kept)

    def _expire(self) -> None:
        now = self._clock()
        kept = self._kept
        while kept:
            _key, (_verdict, expiry, held) = next(iter(kept.items()))
            if expiry > now:
                return
            kept.popitem(last=False)
            self._bytes -= held
