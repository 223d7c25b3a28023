from __future__ import annotations

import threading

from dispatcher.dedupe import DedupeStore

KEY = ("/src", "id-1")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_settled_keys_are_remembered_for_the_window():
    clock = Clock()
    store = DedupeStore(window=10.0, clock=clock)
    claim = store.claim(KEY)
    assert claim is not None
    store.release(claim, settled=True)
    assert store.settled_before(KEY, 0, threading.Event())
    clock.now = 10.5
    assert not store.settled_before(KEY, 0, threading.Event())
    assert len(store) == 0


def test_unsettled_attempts_are_not_remembered():
    store = DedupeStore(window=10.0)
    claim = store.claim(KEY)
    assert claim is not None
    store.release(claim, settled=False)
    assert not store.settled_before(KEY, 0, threading.Event())


def test_a_waiter_gets_the_verdict_of_the_attempt_in_flight():
    store = DedupeStore(window=10.0)
    claim = store.claim(KEY)
    assert claim is not None
    assert store.claim(KEY) is None  # one attempt per key at a time
    results: list[bool] = []
    waiter = threading.Thread(
        target=lambda: results.append(store.settled_before(KEY, 10, threading.Event()))
    )
    waiter.start()
    store.release(claim, settled=True)
    waiter.join(5)
    assert results == [True]


def test_waiting_is_bounded_by_time_and_by_shutdown():
    store = DedupeStore(window=10.0)
    assert store.claim(KEY) is not None
    assert store.settled_before(KEY, 0.05, threading.Event()) is False
    stopping = threading.Event()
    stopping.set()
    assert store.settled_before(KEY, 60, stopping) is False


def test_capacity_forgets_the_oldest_first():
    store = DedupeStore(window=100.0, capacity=3)
    for i in range(5):
        claim = store.claim(("/s", str(i)))
        assert claim is not None
        store.release(claim, settled=True)
    assert len(store) == 3
    assert not store.settled_before(("/s", "0"), 0, threading.Event())
    assert store.settled_before(("/s", "4"), 0, threading.Event())


def test_window_zero_is_off():
    assert DedupeStore(window=0).enabled is False
    assert DedupeStore(window=1).enabled is True
