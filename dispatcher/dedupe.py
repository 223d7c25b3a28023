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

Every call runs on the engine loop's thread, so there are no locks; a waiter
awaits a future, it does not hold a thread.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from dispatcher.loop import Future, Waits

Key = tuple[str, str]  # (source, id)

DEFAULT_CAPACITY = 100_000


@dataclass(slots=True)
class Claim:
    """An attempt in flight. ``done`` (made by the first waiter only: waiters are
    rare) resolves with whether the attempt settled the event."""

    key: Key
    done: Future[bool] | None = None


class DedupeStore:
    def __init__(self, window: float, waits: Waits, capacity: int = DEFAULT_CAPACITY) -> None:
        self._window = window
        self._waits = waits
        self._capacity = capacity
        self._in_flight: dict[Key, Claim] = {}
        self._settled: OrderedDict[Key, float] = OrderedDict()  # key -> expiry, oldest first

    @property
    def enabled(self) -> bool:
        return self._window > 0

    async def claim_or_wait(self, key: Key, wait: float) -> Claim | Literal["settled", "busy"]:
        """For a redelivery: ``"settled"`` if ``key`` was settled here (now or while
        waiting for the attempt in flight), a new ``Claim`` if nobody holds it, or
        ``"busy"`` if another attempt still holds it after ``wait`` or at shutdown.

        Busy must never lead to a second request: the caller gives the message
        back to the broker instead.
        """
        deadline = self._waits.time() + wait
        while True:
            self._expire()
            if key in self._settled:
                return "settled"
            holder = self._in_flight.get(key)
            if holder is None:
                return self._new_claim(key)
            if holder.done is None:
                holder.done = self._waits.future()
            settled = await self._waits.wait(holder.done, deadline - self._waits.time())
            if settled is None:
                return "busy"
            if settled:
                return "settled"
            # The attempt in flight failed; loop to claim it (or find a newer holder).

    def claim(self, key: Key) -> Claim | None:
        """Register an attempt; ``None`` when another attempt for ``key`` is in flight."""
        return None if key in self._in_flight else self._new_claim(key)

    def release(self, claim: Claim, settled: bool) -> None:
        if self._in_flight.get(claim.key) is claim:
            del self._in_flight[claim.key]
        if settled:
            self._settled[claim.key] = self._waits.time() + self._window
            self._settled.move_to_end(claim.key)
            while len(self._settled) > self._capacity:
                self._settled.popitem(last=False)
        if claim.done is not None:
            claim.done.resolve(settled)

    def __len__(self) -> int:
        return len(self._settled)

    def _new_claim(self, key: Key) -> Claim:
        claim = Claim(key)
        self._in_flight[key] = claim
        return claim

    def _expire(self) -> None:
        now = self._waits.time()
        settled = self._settled
        while settled:
            key, expiry = next(iter(settled.items()))
            if expiry > now:
                return
            del settled[key]
