"""Duplicate suppression: what this process has in flight or recently settled, per binding.

When a channel or connection dies under an in-flight delivery, the HTTP
request is not aborted, and the broker redelivers the message on the new
channel. Without this store the subscriber would get the event twice. With
it, a *redelivered* message whose event (source, id) is

- settled here within ``dedupe_window`` (delivered, or accepted by a
  dead-letter target) is acked without a second request;
- still in flight here waits for that attempt: acked if it settles, delivered
  normally if it does not (its verdict died with its channel), and given back
  to the broker, never sent a second time, if it is still running when the
  wait ends.

Only redeliveries consult the store: a first delivery with the same id is a
publisher's duplicate, which stays the subscriber's to judge (and two
different plain messages can share a wrapped digest id). Memory is bounded:
at most ``capacity`` settled keys, oldest forgotten first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Key = tuple[str, str]  # (source, id)

DEFAULT_CAPACITY = 100_000


@dataclass(slots=True)
class Claim:
    """An attempt in flight; waiters block on ``done`` and then read ``settled``.

    ``done`` is made by the first waiter (under the store's lock), not for
    every claim: waiters are rare, and an Event (a lock and a condition) was a
    measurable part of each message's cost.
    """

    key: Key
    done: threading.Event | None = None
    settled: bool = False


class DedupeStore:
    def __init__(
        self,
        window: float,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window
        self._capacity = capacity
        self._clock = clock
        self._lock = threading.Lock()
        self._in_flight: dict[Key, Claim] = {}
        self._settled: OrderedDict[Key, float] = OrderedDict()  # key -> expiry, oldest first

    @property
    def enabled(self) -> bool:
        return self._window > 0

    def claim_or_wait(
        self, key: Key, wait: float, give_up: threading.Event
    ) -> Claim | Literal["settled", "busy"]:
        """For a redelivery: ``"settled"`` if ``key`` was settled here (now or while
        waiting for the attempt in flight), a new ``Claim`` if nobody holds it, or
        ``"busy"`` if another attempt still holds it after ``wait`` or at shutdown.

        Busy must never lead to a second request: the caller gives the message
        back to the broker instead.
        """
        deadline = self._clock() + wait
        while True:
            with self._lock:
                self._expire()
                if key in self._settled:
                    return "settled"
                holder = self._in_flight.get(key)
                if holder is None:
                    return self._new_claim(key)
                if holder.done is None:
                    holder.done = threading.Event()
                done = holder.done
            # Poll the shutdown flag too: a waiter must not outlive the grace period.
            while not done.wait(min(0.5, max(0.0, deadline - self._clock()))):
                if give_up.is_set() or self._clock() >= deadline:
                    return "busy"
            if holder.settled:
                return "settled"
            # The attempt in flight failed; loop to claim it (or find a newer holder).

    def claim(self, key: Key) -> Claim | None:
        """Register an attempt; ``None`` when another attempt for ``key`` is in flight."""
        with self._lock:
            return None if key in self._in_flight else self._new_claim(key)

    def _new_claim(self, key: Key) -> Claim:  # with the lock held
        claim = Claim(key)
        self._in_flight[key] = claim
        return claim

    def release(self, claim: Claim, settled: bool) -> None:
        with self._lock:
            self._in_flight.pop(claim.key, None)
            if settled:
                self._settled[claim.key] = self._clock() + self._window
                self._settled.move_to_end(claim.key)
                while len(self._settled) > self._capacity:
                    self._settled.popitem(last=False)
            # Under the lock: a waiter either made ``done`` already or will not
            # find this claim any more (it is no longer in flight).
            claim.settled = settled
            done = claim.done
        if done is not None:
            done.set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._settled)

    def _expire(self) -> None:
        now = self._clock()
        while self._settled:
            key, expiry = next(iter(self._settled.items()))
            if expiry > now:
                return
            del self._settled[key]
