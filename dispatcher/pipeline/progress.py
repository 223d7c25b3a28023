"""Progress on a terminal for ``archive``, ``report`` and ``replay``, as pip and curl show it.

Only when stdout is a terminal: one line, redrawn in place a few times a
second (what was done so far, its rate, the time elapsed) and erased before
the summary line. When stdout is a file or a pipe nothing is written here, so
a log collector or a script gets the summary line alone.

Where the count comes from:

- ``archive`` counts the events it has archived itself.
- ``report`` and replay's reading show the input bytes Spark has read
  (``SparkBytesRead``): Spark counts its tasks' input when each task ends,
  so the line moves a task at a time; lines are counted, exactly, in the
  summary.
- replay's publishing: each partition's publisher sends its confirmed count
  to the driver in a UDP datagram at most a few times a second
  (``PublishedCounts``); a datagram that is lost or cannot be sent costs a
  redraw, never the job. Nothing is sent when stdout is not a terminal.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final, TextIO

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REDRAW_EVERY: Final = 0.25  # seconds between redraws, at most
JOIN_BOUND: Final = 5.0  # seconds the end of a block waits for its polling thread
# Back to the line's start, and clear it (ECMA-48 EL).
ERASE: Final = "\r\x1b[K"


class Progress:
    """One redrawn line on ``stream`` when it is a terminal; nothing otherwise."""

    def __init__(
        self,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self.enabled = self._stream.isatty()
        self._clock = clock
        self._started = clock()
        self._drawn_at = -REDRAW_EVERY
        self._drawn = False
        self._lock = threading.Lock()

    def show(self, count: float, unit: str, done: str) -> None:
        """``count`` ``unit`` ``done`` so far ("1,200 events archived"); any thread."""
        if not self.enabled:
            return
        with self._lock:
            now = self._clock()
            if now - self._drawn_at < REDRAW_EVERY:
                return
            self._drawn_at = now
            elapsed = now - self._started
            rate = count / elapsed if elapsed > 0 else 0.0
            self._write(
                f"{ERASE}{_number(count)} {unit} {done}, {_number(rate)} {unit}/s, "
                f"{_clock_time(elapsed)}"
            )
            self._drawn = True

    def close(self) -> None:
        """Erase the line, so the summary starts on a clean one."""
        with self._lock:
            if self._drawn:
                self._write(ERASE)
                self._drawn = False

    @contextlib.contextmanager
    def polling(self, read: Callable[[], tuple[float, str, str]]) -> Iterator[None]:
        """Redraw from ``read()`` (count, unit, done) every ``REDRAW_EVERY`` seconds
        until the block ends; then erase the line."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(REDRAW_EVERY):
                with contextlib.suppress(Exception):  # progress must never fail a job
                    self.show(*read())

        thread = threading.Thread(target=poll, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            # Bounded: a reader stuck in the JVM must not hold the command's exit.
            thread.join(JOIN_BOUND)
            self.close()

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed terminal
            self._stream.write(text)
            self._stream.flush()


def _number(value: float) -> str:
    return f"{value:,.0f}"


def _clock_time(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


# --------------------------------------------------------------------- Spark


class SparkBytesRead:
    """What ``Progress.polling`` shows while Spark reads: the input megabytes
    (files, and cached data read again) of every task Spark has finished in
    this application, from its status store. A stage that has ended is asked
    once: its figure no longer changes."""

    _ENDED: Final = frozenset({"COMPLETE", "SKIPPED", "FAILED"})

    def __init__(self, spark: SparkSession) -> None:
        self._tracker = spark.sparkContext.statusTracker()
        self._store = spark.sparkContext._jsc.sc().statusStore()
        self._ended: dict[int, int] = {}  # stage id -> its input bytes

    def __call__(self) -> tuple[float, str, str]:
        running = 0
        for job in self._tracker.getJobIdsForGroup(None):
            info = self._tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                if stage in self._ended:
                    continue
                with contextlib.suppress(Exception):  # a stage that never ran has no attempt
                    data = self._store.lastStageAttempt(stage)
                    if str(data.status()) in self._ENDED:
                        self._ended[stage] = int(data.inputBytes())
                    else:
                        running += int(data.inputBytes())
        return (running + sum(self._ended.values())) / 1_000_000, "MB", "read"


class PublishedCounts:
    """The driver's end of replay's progress: confirmed counts per partition,
    each the latest its publisher sent."""

    def __init__(self, host: str) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._socket.bind((host, 0))
        except OSError:
            self._socket.close()  # the caller goes on without it
            raise
        self._socket.settimeout(REDRAW_EVERY)
        self.address: tuple[str, int] = self._socket.getsockname()
        self._counts: dict[int, int] = {}
        self._lock = threading.Lock()  # the receiving thread adds partitions as they report
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="published", daemon=True)
        self._thread.start()

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def close(self) -> None:
        self._closed.set()
        self._thread.join()  # bounded: its recv times out every REDRAW_EVERY
        self._socket.close()

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._socket.recv(64)
            except OSError:  # the timeout: look at _closed again
                continue
            with contextlib.suppress(ValueError), self._lock:
                partition, count = (int(part) for part in data.split())
                self._counts[partition] = max(count, self._counts.get(partition, 0))


class PublishedSender:
    """A partition's end: its confirmed count, to ``address``, at most every
    ``REDRAW_EVERY`` seconds; ``close`` sends the last one and releases the socket."""

    def __init__(self, address: tuple[str, int], partition: int) -> None:
        self._address = address
        self._partition = partition
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sent_at = 0.0

    def __call__(self, published: int) -> None:
        now = time.monotonic()
        if now - self._sent_at >= REDRAW_EVERY:
            self._sent_at = now
            self._send(published)

    def close(self, published: int) -> None:
        self._send(published)
        self._socket.close()

    def _send(self, published: int) -> None:
        with contextlib.suppress(OSError):  # progress is best effort
            self._socket.sendto(f"{self._partition} {published}".encode(), self._address)
