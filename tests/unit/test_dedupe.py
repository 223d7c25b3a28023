"""Duplicate suppression on the engine loop: waiters await futures, they hold no thread."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any

import pytest

from dispatcher.delivery.dedupe import MemoryDedupe
from dispatcher.delivery.seams import Claim
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Loop

KEY = ("/src", "id-1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def loop():
    made = Loop()
    yield made
    made.close()


def store_on(loop: Loop, window: float = 10.0, **kwargs: Any) -> MemoryDedupe:
    return MemoryDedupe(window, Waits(loop), **kwargs)


def run(loop: Loop, coro: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coro)


def settle(store: MemoryDedupe, key=KEY, settled: bool = True) -> None:
    claim = store.claim(key)
    assert claim is not None
    store.release(claim, settled)


def test_settled_keys_are_remembered_for_the_window():
    clock = Clock()
    loop = Loop(clock=clock)
    store = store_on(loop)
    settle(store)
    assert run(loop, store.claim_or_wait(KEY, 0)) == "settled"
    clock.now = 10.5
    assert isinstance(run(loop, store.claim_or_wait(KEY, 0)), Claim)  # forgotten: deliver again
    assert len(store) == 0
    loop.close()


def test_unsettled_attempts_are_not_remembered(loop):
    store = store_on(loop)
    settle(store, settled=False)
    assert isinstance(run(loop, store.claim_or_wait(KEY, 0)), Claim)


def test_a_waiter_gets_the_verdict_of_the_attempt_in_flight(loop):
    store = store_on(loop)
    claim = store.claim(KEY)
    assert claim is not None
    assert store.claim(KEY) is None  # one attempt per key at a time
    loop.call_later(0.05, store.release, claim, True)
    started = time.monotonic()
    assert run(loop, store.claim_or_wait(KEY, 10)) == "settled"
    assert time.monotonic() - started < 2  # woken by the release, not the 10 s bound


def test_a_waiter_claims_after_the_attempt_in_flight_failed(loop):
    store = store_on(loop)
    claim = store.claim(KEY)
    assert claim is not None
    loop.call_later(0.05, store.release, claim, False)
    found = run(loop, store.claim_or_wait(KEY, 10))
    assert isinstance(found, Claim)
    assert store.claim(KEY) is None  # the waiter holds it now


def test_a_busy_key_is_never_claimed_while_its_attempt_runs(loop):
    """Review finding: a waiter that timed out used to deliver a second time."""
    store = store_on(loop)
    assert store.claim(KEY) is not None
    assert run(loop, store.claim_or_wait(KEY, 0.05)) == "busy"
    assert store.claim(KEY) is None  # and the original still holds it


def test_shutdown_ends_the_wait_as_busy(loop):
    waits = Waits(loop)
    store = MemoryDedupe(10.0, waits)
    assert store.claim(KEY) is not None
    loop.call_later(0.05, waits.give_up)
    started = time.monotonic()
    assert run(loop, store.claim_or_wait(KEY, 60)) == "busy"
    assert time.monotonic() - started < 5
    assert run(loop, store.claim_or_wait(KEY, 60)) == "busy"  # and every later wait, at once


def test_capacity_forgets_the_oldest_first(loop):
    store = store_on(loop, 100.0, capacity=3)
    for i in range(5):
        settle(store, ("/s", str(i)))
    assert len(store) == 3
    assert isinstance(run(loop, store.claim_or_wait(("/s", "0"), 0)), Claim)
    assert run(loop, store.claim_or_wait(("/s", "4"), 0)) == "settled"


def test_window_zero_is_off(loop):
    assert store_on(loop, 0).enabled is False
    assert store_on(loop, 1).enabled is True


def test_waiters_that_arrive_before_the_release_are_all_woken(loop):
    # A claim makes no future until someone waits; every waiter must share the one
    # made and be woken by the release (a lost wake-up would hold them to the deadline).
    store = store_on(loop)
    claim = store.claim(KEY)
    assert claim is not None and claim.done is None  # nobody waits: nothing made

    async def two_waiters() -> list[object]:
        first = loop.spawn(store.claim_or_wait(KEY, 30))
        second = loop.spawn(store.claim_or_wait(KEY, 30))
        assert claim.done is not None  # both are waiting on the one future
        loop.call_later(0.05, store.release, claim, True)
        return [await first.finished, await second.finished]

    started = time.monotonic()
    assert run(loop, two_waiters()) == ["settled", "settled"]
    assert time.monotonic() - started < 2  # woken by the release, not by their 30 s deadline


# ----------------------------------------------------------------- the shared layer


class FakeStore:
    """Answers claims from a script (1 claimed, 2 settled, 0 held elsewhere, None no
    answer), the last answer repeating; records what was claimed and settled."""

    def __init__(self, loop: Loop, answers: list[int | None]) -> None:
        self._loop = loop
        self._answers = answers
        self.up = True
        self.claims: list[tuple[str, str]] = []
        self.settles: list[tuple[str, str, bool]] = []

    def claim(self, key: str, owner: str, ttl: float, verdict_key: str | None = None) -> Any:
        self.claims.append((key, owner))
        answer = self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]
        future = self._loop.create_future()
        self._loop.call_soon(future.resolve, answer)
        return future

    def settle(
        self, key: str, owner: str, settled: bool, window: float, verdict: Any = None
    ) -> None:
        self.settles.append((key, owner, settled))


def shared_on(loop: Loop, store: FakeStore) -> Any:
    from dispatcher.delivery.dedupe import SharedDedupe

    waits = Waits(loop)
    return SharedDedupe("b", 10.0, 30.0, waits, store, MemoryDedupe(10.0, waits))


def test_a_store_that_stops_answering_never_lets_a_held_event_be_sent(loop) -> None:
    # Held elsewhere, then no answer at all: that owner may still be delivering.
    store = FakeStore(loop, [0, None])
    shared = shared_on(loop, store)
    started = time.monotonic()
    assert run(loop, shared.claim_or_wait(KEY, 0.4)) == "busy"
    assert time.monotonic() - started >= 0.35
    assert len(store.claims) > 2  # it kept asking until the wait ended


def test_a_busy_answer_releases_what_a_lost_poll_may_have_claimed(loop) -> None:
    # Held elsewhere, then polls without an answer: one of them may have been
    # applied, so the key may be ours now. Busy must not leave it held to its TTL.
    store = FakeStore(loop, [0, None])
    assert run(loop, shared_on(loop, store).claim_or_wait(KEY, 0.2)) == "busy"
    [(key, owner)] = set(store.claims)
    assert store.settles == [(key, owner, False)]


def test_an_unanswered_store_before_any_owner_leaves_memory_in_charge(loop) -> None:
    store = FakeStore(loop, [None])
    found = run(loop, shared_on(loop, store).claim_or_wait(KEY, 5.0))
    assert isinstance(found, Claim)


def test_a_claim_whose_answer_was_lost_is_still_settled_by_its_owner(loop) -> None:
    # The call timed out, but Redis may have applied it: the owner must settle it.
    store = FakeStore(loop, [None])
    shared = shared_on(loop, store)
    claim = run(loop, shared.claim_first(KEY, 30.0))
    shared.release(claim, True)
    [(key, owner)] = store.claims
    assert store.settles == [(key, owner, True)]


def test_polls_of_one_claim_use_one_owner_value(loop) -> None:
    # A poll whose answer was lost may have taken the key: the next must see it as its own.
    store = FakeStore(loop, [0, None, 0, 1])
    found = run(loop, shared_on(loop, store).claim_or_wait(KEY, 10.0))
    assert isinstance(found, Claim)
    assert len({owner for _, owner in store.claims}) == 1
    assert len(store.claims) == 4


def test_a_settled_answer_acks_and_a_held_one_waits_for_it(loop) -> None:
    store = FakeStore(loop, [0, 0, 2])
    assert run(loop, shared_on(loop, store).claim_or_wait(KEY, 10.0)) == "settled"
    assert len(store.claims) == 3


@pytest.mark.parametrize(("answers", "polls"), [([0, 0, 2], 3), ([0, 1], 2), ([0, None, 1], 3)])
def test_a_first_delivery_held_elsewhere_waits_for_that_attempt(loop, answers, polls) -> None:
    """Another replica holds the key of a first delivery: the broker redelivered it
    there after this message's channel died (their claims raced), or the publisher
    sent it twice. Never both requests at once: it waits for that attempt to settle,
    be released or expire, and only then goes on (the handler sends nothing if the
    channel is gone)."""
    store = FakeStore(loop, answers)
    started = time.monotonic()
    claim = run(loop, shared_on(loop, store).claim_first(KEY, 30.0))
    assert isinstance(claim, Claim)
    assert len(store.claims) == polls
    assert time.monotonic() - started >= 0.05 * (polls - 1)  # it polled, with pauses


def test_a_first_delivery_claimed_or_unanswered_goes_at_once(loop) -> None:
    for answers in ([1], [2], [None]):
        store = FakeStore(loop, answers)
        assert isinstance(run(loop, shared_on(loop, store).claim_first(KEY, 30.0)), Claim)
        assert len(store.claims) == 1, answers


def test_a_first_delivery_waits_for_the_attempt_in_flight_here(loop) -> None:
    """The publisher's other copy (or the event's own redelivery) is in flight in
    this process: the first delivery waits for it, then is claimed and goes."""
    store = MemoryDedupe(10.0, Waits(loop))
    holder = store.claim(KEY)
    assert holder is not None
    loop.call_later(0.1, store.release, holder, True)
    started = time.monotonic()
    claim = run(loop, store.claim_first(KEY, 10.0))
    assert isinstance(claim, Claim) and claim is not holder
    assert 0.08 < time.monotonic() - started < 5


def test_a_first_delivery_behind_an_attempt_that_outlives_the_wait_is_busy(loop) -> None:
    store = MemoryDedupe(10.0, Waits(loop))
    assert store.claim(KEY) is not None
    assert run(loop, store.claim_first(KEY, 0.1)) == "busy"
