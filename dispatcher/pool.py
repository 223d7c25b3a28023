"""Bounded worker threads for one binding: HTTP work never runs on the pika thread.

Workers are daemon threads: a subscriber that hangs forever must not keep the
process alive past its shutdown bound (ThreadPoolExecutor joins its threads
at interpreter exit, so it cannot give that guarantee). The queue is bounded
by the broker, not here: prefetch equals the number of workers, so at most
``size`` deliveries are ever queued or running.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkerPool(Generic[T]):
    def __init__(self, name: str, size: int, work: Callable[[T], None]) -> None:
        self._work = work
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._busy = 0
        self._idle = threading.Condition()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(size)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, item: T) -> None:
        # Under the lock stop() takes too: an item is either refused or queued
        # ahead of the stop sentinels, never stranded behind them uncounted.
        with self._idle:
            if self._stopping.is_set():
                return  # shutting down: the message stays unacked and the broker redelivers it
            self._busy += 1
            self._queue.put(item)

    def stop(self) -> None:
        """Start no new work; queued items are dropped (their messages stay unacked)."""
        with self._idle:
            self._stopping.set()
            for _ in self._threads:
                self._queue.put(None)

    def wait_idle(self, timeout: float) -> bool:
        """True once nothing is queued or running; False if ``timeout`` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if not self._stopping.is_set():
                    self._work(item)
            finally:
                with self._idle:
                    self._busy -= 1
                    if self._busy == 0:
                        self._idle.notify_all()
