from __future__ import annotations

import threading

from dispatcher.pool import WorkerPool


def test_runs_work_on_its_threads_and_reports_idle():
    seen: list[str] = []
    lock = threading.Lock()

    def work(item: int) -> None:
        with lock:
            seen.append(threading.current_thread().name)

    pool: WorkerPool[int] = WorkerPool("w", 3, work)
    for i in range(30):
        pool.submit(i)
    assert pool.wait_idle(5)
    assert len(seen) == 30
    assert all(name.startswith("w-") for name in seen)


def test_stop_drops_queued_work_and_wait_idle_is_bounded():
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    def work(item: int) -> None:
        started.set()
        ran.append(item)
        release.wait(5)

    pool: WorkerPool[int] = WorkerPool("w", 1, work)
    for i in range(5):
        pool.submit(i)
    assert started.wait(5)
    pool.stop()
    assert pool.wait_idle(0.1) is False  # item 0 still running: bounded, not blocked
    release.set()
    assert pool.wait_idle(5)
    assert ran == [0]
    pool.submit(99)  # after stop: dropped, never blocks idleness
    assert pool.wait_idle(0.1)
    assert ran == [0]


def test_threads_are_daemons():
    pool: WorkerPool[int] = WorkerPool("d", 2, lambda _i: None)
    assert all(t.daemon for t in pool._threads)
