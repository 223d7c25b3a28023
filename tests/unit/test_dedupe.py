from __future__ import annotations

import threading
import time

from dispatcher.dedupe import Claim, DedupeStore

KEY = ("/src", "id-1")
NEVER = threading.Event()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def settle(store: DedupeStore, key=KEY, settled: bool = True) -> None:
    claim = store.claim(key)
    assert claim is not None
    store.release(claim, settled)


def test_settled_keys_are_remembered_for_the_window():
    clock = Clock()
    store = DedupeStore(window=10.0, clock=clock)
    settle(store)
    assert store.claim_or_wait(KEY, 0, NEVER) == "settled"
    clock.now = 10.5
    assert isinstance(store.claim_or_wait(KEY, 0, NEVER), Claim)  # forgotten: deliver again
    assert len(store) == 0


def test_unsettled_attempts_are_not_remembered():
    store = DedupeStore(window=10.0)
    settle(store, settled=False)
    assert isinstance(store.claim_or_wait(KEY, 0, NEVER), Claim)


def test_a_waiter_gets_the_verdict_of_the_attempt_in_flight():
    store = DedupeStore(window=10.0)
    claim = store.claim(KEY)
    assert claim is not None
    assert store.claim(KEY) is None  # one attempt per key at a time
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(store.claim_or_wait(KEY, 10, NEVER)))
    waiter.start()
    store.release(claim, settled=True)
    waiter.join(5)
    assert results == ["settled"]


def test_a_waiter_claims_after_the_attempt_in_flight_failed():
    store = DedupeStore(window=10.0)
    claim = store.claim(KEY)
    assert claim is not None
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(store.claim_or_wait(KEY, 10, NEVER)))
    waiter.start()
    store.release(claim, settled=False)
    waiter.join(5)
    assert isinstance(results[0], Claim)


def test_a_busy_key_is_never_claimed_while_its_attempt_runs():
    """Review finding: a waiter that timed out used to deliver a second time."""
    store = DedupeStore(window=10.0)
    assert store.claim(KEY) is not None
    assert store.claim_or_wait(KEY, 0.05, NEVER) == "busy"
    assert store.claim(KEY) is None  # and the original still holds it


def test_shutdown_ends_the_wait_as_busy():
    store = DedupeStore(window=10.0)
    assert store.claim(KEY) is not None
    stopping = threading.Event()
    stopping.set()
    assert store.claim_or_wait(KEY, 60, stopping) == "busy"


def test_capacity_forgets_the_oldest_first():
    store = DedupeStore(window=100.0, capacity=3)
    for i in range(5):
        settle(store, ("/s", str(i)))
    assert len(store) == 3
    assert isinstance(store.claim_or_wait(("/s", "0"), 0, NEVER), Claim)
    assert store.claim_or_wait(("/s", "4"), 0, NEVER) == "settled"


def test_window_zero_is_off():
    assert DedupeStore(window=0).enabled is False
    assert DedupeStore(window=1).enabled is True


def test_waiters_that_arrive_before_the_release_are_all_woken():
    # A claim makes no Event until someone waits; every waiter must share the one
    # made and be woken by the release (a lost wake-up would hold them to the deadline).
    store = DedupeStore(window=10.0)
    claim = store.claim(KEY)
    assert claim is not None and claim.done is None  # nobody waits: nothing made
    results: list[object] = []
    waiters = [
        threading.Thread(target=lambda: results.append(store.claim_or_wait(KEY, 30, NEVER)))
        for _ in range(2)
    ]
    for waiter in waiters:
        waiter.start()
    deadline = time.monotonic() + 5
    while claim.done is None or sum(w.is_alive() for w in waiters) < 2:
        assert time.monotonic() < deadline, "the waiters never started waiting"
        time.sleep(0.005)
    started = time.monotonic()
    store.release(claim, settled=True)
    for waiter in waiters:
        waiter.join(5)
    assert results == ["settled", "settled"]
    assert time.monotonic() - started < 2  # woken by the release, not by their 30 s deadline
