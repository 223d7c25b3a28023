"""Duplicate suppression: what this process has in flight or recently settled, per binding.

When a channel or connection dies under an in-flight delivery, the HTTP
request is not aborted, and the broker redelivers the message on the new
channel. Without this store the subscriber would get the event twice. With
it, a *redelivered* message whose event (source, id) is

- settled here within ``dedupe_window`` (delivered, or accepted by a
  dead-letter target) is acked without a second request;
- still in flight here waits for that attempt: acked if it settles, delivered
  normally if it does not (its action died with its channel), and given back
  to the broker, never sent a second time, if it is still running when the
  wait ends.

Only redeliveries are suppressed: a first delivery with the same id is a
publisher's duplicate, which stays the subscriber's to judge (and two
different plain messages can share a wrapped digest id). But never two
attempts at once: a first delivery whose key another attempt holds waits for
it to end, then goes. Memory is bounded: at most ``capacity`` settled keys,
oldest forgotten first.

An attempt that ends unsettled may leave a ``Verdict`` (``verdicts``): what the
subscriber's answers decided, which only a publish failed to carry out. It is
remembered for ``dedupe_window`` too, and the claim of the event's next
redelivery carries it (``Claim.verdict``): that delivery publishes again
instead of asking the subscriber again.

Every call runs on the engine loop's thread, so there are no locks; a waiter
awaits a future, it does not hold a thread.

``SharedDedupe`` adds the store every replica shares (``dedupe.store``,
``redis_claims``): when one replica's connection dies, the broker redelivers
to any replica, usually another. Memory is asked first (this process's own
attempts and settlements, answered at once), then the store: a redelivery
finds there an event settled by any replica (ack, no request), a claim of a
live owner (wait, bounded, polling; then ack if it settled, else give it back
to the broker) or a claim whose owner died (its TTL passed: deliver). A
redelivery's claim in the store also reads the verdict an attempt on any
replica left. A store that does not answer leaves memory in charge, as
without a store.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import socket
from collections import OrderedDict
from typing import Final, Literal

from dispatcher.delivery import verdicts
from dispatcher.delivery.seams import Claim, ClaimStore, Found
from dispatcher.delivery.verdicts import Verdict, VerdictMemory
from dispatcher.delivery.waits import Waits
from dispatcher.event.cloudevent import Key
from dispatcher.loop import Future
from dispatcher.observe import tracing
from dispatcher.observe.logs import get_logger

log = get_logger()

DEFAULT_CAPACITY = 100_000


class MemoryDedupe:
    def __init__(self, window: float, waits: Waits, capacity: int = DEFAULT_CAPACITY) -> None:
        self._window = window
        self._waits = waits
        self._capacity = capacity
        self._in_flight: dict[Key, Claim] = {}
        self._settled: OrderedDict[Key, float] = OrderedDict()  # key -> expiry, oldest first
        self._verdicts = VerdictMemory(window, waits.time)

    @property
    def enabled(self) -> bool:
        return self._window > 0

    async def claim_or_wait(self, key: Key, wait: float) -> Claim | Found:
        """For a redelivery: ``"settled"`` if ``key`` was settled here (now or while
        waiting for the attempt in flight), a new ``Claim`` if nobody holds it (with
        the verdict an earlier attempt left, if any), or ``"busy"`` if another
        attempt still holds it after ``wait`` or at shutdown.

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
                claim = self._new_claim(key)
                claim.verdict = self._verdicts.get(key)
                return claim
            if holder.done is None:
                holder.done = self._waits.future()
            tracing.note("claim wait", {"holder": "this process"})
            settled = await self._waits.wait(holder.done, deadline - self._waits.time())
            if settled is None:
                return "busy"
            if settled:
                return "settled"
            # The attempt in flight failed; loop to claim it (or find a newer holder).

    def claim(self, key: Key) -> Claim | None:
        """Register an attempt; ``None`` when another attempt for ``key`` is in flight."""
        return None if key in self._in_flight else self._new_claim(key)

    async def claim_first(self, key: Key, wait: float) -> Claim | Literal["busy"]:
        """For a first delivery: a claim once no other attempt here holds ``key``.

        Another in flight is the publisher's other copy of the event, or this
        event's redelivery after a channel flap: the first attempt ends before
        this one starts (then it goes all the same: a publisher's duplicate is
        the subscriber's to judge), never both at once, and this one is claimed
        and remembered like any other. ``"busy"`` if the other still runs after
        ``wait`` or at shutdown.
        """
        deadline = self._waits.time() + wait
        while (holder := self._in_flight.get(key)) is not None:
            if holder.done is None:
                holder.done = self._waits.future()
            tracing.note("claim wait", {"holder": "this process"})
            if await self._waits.wait(holder.done, deadline - self._waits.time()) is None:
                return "busy"
        return self._new_claim(key)

    def release(self, claim: Claim, settled: bool, verdict: Verdict | None = None) -> None:
        """The attempt ended: ``settled``, or not, leaving ``verdict`` for the
        redelivery to carry out (None: the next attempt decides afresh)."""
        if self._in_flight.get(claim.key) is claim:
            del self._in_flight[claim.key]
        if settled:
            self._verdicts.forget(claim.key)
            self._settled[claim.key] = self._waits.time() + self._window
            self._settled.move_to_end(claim.key)
            while len(self._settled) > self._capacity:
                self._settled.popitem(last=False)
        elif verdict is not None:
            self._verdicts.remember(claim.key, verdict)
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


HELD: Final = 0  # by another owner
CLAIMED: Final = 1
SETTLED: Final = 2
FIRST_POLL: Final = 0.05
MAX_POLL: Final = 1.0


class SharedDedupe:
    """One binding's duplicate suppression across replicas: memory, then the store."""

    def __init__(
        self,
        binding: str,
        window: float,
        claim_ttl: float,
        waits: Waits,
        store: ClaimStore,
        local: MemoryDedupe,
    ) -> None:
        self._prefix = f"dispatcher:dedupe:{binding}:"
        self._window = window
        self._ttl = claim_ttl  # at least as long as an attempt may take: an owner's bound
        self._waits = waits
        self._store = store
        self._local = local
        self._owner = f"c:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}:"
        self._serial = itertools.count()

    @property
    def enabled(self) -> bool:
        return self._window > 0

    async def claim_first(self, key: Key, wait: float) -> Claim | Literal["busy"]:
        deadline = self._waits.time() + wait
        # Every delivery comes here: the common case (nobody holds the key) is one
        # awaited answer, the polls only when another replica holds it.
        claim = self._local.claim(key)
        if claim is None:  # another attempt here holds it: wait for that first
            found = await self._local.claim_first(key, wait)
            if not isinstance(found, Claim):
                return found
            claim = found
        # Claimed in the store so that a redelivery elsewhere waits for this attempt.
        # Held by another replica's attempt: either the publisher sent the event
        # twice, or this message's channel died and the broker has already
        # redelivered it there, whose claim got in first. Never both at once:
        # wait for that attempt to end. Then a publisher's duplicate is delivered
        # all the same, and the handler sends nothing for a message whose channel
        # is gone (``Received.channel``).
        asked = self._shared_claim(claim, False)
        if await asked == HELD and await self._poll(claim, deadline, asked=asked) == HELD:
            log.info("first delivery held by another replica past its claim", ce_id=key[1])
        return claim

    async def claim_or_wait(self, key: Key, wait: float) -> Claim | Found:
        deadline = self._waits.time() + wait
        found = await self._local.claim_or_wait(key, wait)
        if not isinstance(found, Claim):
            return found
        # This replica's own verdict is the newest there is; else the store's.
        answer = await self._poll(found, deadline, read_verdict=found.verdict is None)
        if isinstance(answer, bytes):
            found.verdict = verdicts.decode(answer)
            if found.verdict is None:
                log.warning("unreadable verdict in the dedupe store: decided afresh", ce_id=key[1])
            return found
        if answer == SETTLED:
            self._local.release(found, True)
            return "settled"
        if answer == HELD:
            # Released in the store too: a poll whose answer was lost may
            # have taken the key for us, and would hold it until its TTL.
            self.release(found, False)
            return "busy"
        if answer is None:
            log.info("redelivery decided by memory: the dedupe store did not answer", ce_id=key[1])
        return found

    async def _poll(
        self,
        claim: Claim,
        deadline: float,
        read_verdict: bool = False,
        asked: Future[int | bytes | None] | None = None,
    ) -> int | bytes | None:
        """Claim in the store; while another replica's attempt holds the key, wait
        for it to settle, be released or expire, polling. HELD if it still holds it
        at ``deadline`` (or at shutdown); None if the store never answered. With
        ``read_verdict``, a claim that finds a verdict left for the event answers
        with it (bytes: claimed, and that verdict).

        Once another owner was seen, a store that stops answering is not a licence
        to send: that owner may still be at it, so the polls go on. ``asked``: the
        first claim, already made."""
        pause = FIRST_POLL
        held_elsewhere = False
        if asked is None:
            asked = self._shared_claim(claim, read_verdict)
        while True:
            answer = await asked
            if answer in (CLAIMED, SETTLED) or isinstance(answer, bytes):
                return answer
            if answer is None and not held_elsewhere:
                return answer
            if not held_elsewhere:
                tracing.note("claim wait", {"holder": "another replica"})
            held_elsewhere = True
            left = deadline - self._waits.time()
            if left <= 0 or not await self._waits.sleep(min(pause, left)):
                return HELD
            pause = min(pause * 2, MAX_POLL)
            asked = self._shared_claim(claim, read_verdict)

    def release(self, claim: Claim, settled: bool, verdict: Verdict | None = None) -> None:
        self._local.release(claim, settled, verdict)
        if claim.shared is not None:
            store_key, owner = claim.shared
            left = None
            if verdict is not None and not settled:
                left = (_verdict_key(store_key), verdicts.encode(verdict))
            self._store.settle(store_key, owner, settled, self._window, left)

    def _shared_claim(self, claim: Claim, read_verdict: bool) -> Future[int | bytes | None]:
        # One owner value per claim, kept whatever the answer: a call that timed out
        # may still have been applied, and then the claim is ours to settle or
        # release (the scripts change a key only for its owner), and a later poll
        # recognises it as ours. Nothing is written for an answer of busy or settled.
        if claim.shared is None:
            claim.shared = (self._store_key(claim.key), f"{self._owner}{next(self._serial)}")
        store_key, owner = claim.shared
        verdict_key = _verdict_key(store_key) if read_verdict else None
        # No timer here: the store answers every claim within its bounds.
        return self._store.claim(store_key, owner, self._ttl, verdict_key)

    def _store_key(self, key: Key) -> str:
        source, event_id = key
        digest = hashlib.blake2b(
            f"{source}\0{event_id}".encode("utf-8", "surrogatepass"), digest_size=16
        ).hexdigest()
        return self._prefix + digest


def _verdict_key(store_key: str) -> str:
    """Where the store keeps the verdict an attempt left for an event: beside its
    claim, with the binding's prefix (what a cleanup of the binding's keys finds)."""
    return store_key + ":v"
