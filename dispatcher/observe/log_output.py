"""Where every log line goes: stdout, without ever blocking the engine loop.

A log line is written on the loop thread (the delivery lines, every broker
event). A stdout pipe that nobody reads fills in 64 KiB, and a blocking
write into it would stop the loop: heartbeats, acks of work already decided,
every delivery (FIELD-NOTES invariant 4). So while a service runs, stdout is
written through a descriptor of its own in non-blocking mode: what the pipe
cannot take now waits in memory (at most ``PENDING_MAX`` bytes) and goes out
when the loop sees the pipe writable again. Beyond that, lines are dropped,
never half a line, counted (``dispatcher_log_lines_dropped_total``), and one
line (at error level, so that no ``logging.level`` hides it) says how many once
the pipe drains.

The descriptor is a fresh open of the same pipe or terminal
(``/proc/self/fd/1``), so the non-blocking flag does not leak to whoever
shares our stdout (a shell, a container runtime); where that cannot be done
(a socket), it is a duplicate whose flag is put back at ``detach``. A regular
file never blocks for long and is written as before, as is a stdout that is
not a descriptor at all (a test's capture).

Every writer, whatever its thread, goes through ``write`` under one lock, so
lines never interleave and the pending bytes always go first.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Protocol


class Drainer(Protocol):
    """What of the engine loop drains held lines (``dispatcher.loop.Loop``): said
    here, so that the loop, which logs, and the output, which it drains, do not
    import each other."""

    def on_loop_thread(self) -> bool: ...

    def call_soon_threadsafe(self, callback: Callable[[Any], object], arg: Any) -> bool: ...

    def watch(self, fd: int, mask: int, callback: Callable[[int, int], object]) -> None: ...

    def unwatch(self, fd: int) -> None: ...


PENDING_MAX: Final = 4 * 1024 * 1024  # bytes held while stdout is not read
_DETACH_BOUND: Final = 1.0  # seconds the last pending lines get at shutdown


class Output:
    def __init__(self, say_dropped: Callable[[int], None]) -> None:
        """``say_dropped(n)``: log that ``n`` lines were dropped (called on the loop,
        outside the lock, once the pipe has drained)."""
        self._say_dropped = say_dropped
        self._lock = threading.Lock()
        self._fd: int | None = None  # set while attached to a loop
        self._restore_flags: int | None = None  # a shared description's flags, to put back
        self._loop: Drainer | None = None
        self._writable = 0
        self._pending = bytearray()
        self._armed = False  # the loop watches for the descriptor to take more
        self._dropped_since = 0  # lines dropped, not yet said
        self.dropped = 0  # lines dropped, ever

    def write(self, text: str) -> None:
        """``text`` is whole lines, each ending in a newline."""
        with self._lock:
            if self._fd is None:
                stream = sys.stdout  # per call: whoever replaced stdout (tests) gets it
                stream.write(text)
                stream.flush()
                return
            self._send(text.encode("utf-8", "replace"))

    def attach(self, loop: Drainer, writable: int) -> bool:
        """Write without blocking from now on, ``loop`` draining what waits. False (and
        writes stay as they were) when stdout is a file, or no descriptor at all."""
        with self._lock:
            if self._fd is not None:
                return False  # another service of this process has it (tests)
            opened = _nonblocking_stdout()
            if opened is None:
                return False
            sys.stdout.flush()
            self._fd, self._restore_flags = opened
            self._loop, self._writable = loop, writable
        return True

    def detach(self) -> None:
        """Back to plain writes: what waits gets ``_DETACH_BOUND`` seconds to go out
        (the loop has stopped; shutdown stays bounded), the rest is dropped."""
        with self._lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            deadline = time.monotonic() + _DETACH_BOUND
            poller = select.poll()  # not select(): the descriptor may be past 1,023
            poller.register(fd, select.POLLOUT)
            try:
                while self._pending and time.monotonic() < deadline:
                    poller.poll(max(0, int((deadline - time.monotonic()) * 1000)))
                    with contextlib.suppress(BlockingIOError):
                        del self._pending[: os.write(fd, self._pending)]
            except OSError:
                pass  # the reader is gone (a broken pipe): what is left cannot go out
            finally:
                self._pending.clear()
                self._armed = False
                flags, self._restore_flags = self._restore_flags, None
                with contextlib.suppress(OSError):
                    if flags is not None:
                        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
                os.close(fd)

    # ----------------------------------------------------------------- under the lock

    def _send(self, data: bytes) -> None:
        if self._pending:
            self._hold(data)
            return
        assert self._fd is not None
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError:  # the reader is gone (EPIPE): nobody to tell
            self._count_dropped(data)
            return
        if written < len(data):
            self._pending += data[written:]  # never half a line: the rest always waits
            self._arm()

    def _hold(self, data: bytes) -> None:
        if len(self._pending) + len(data) > PENDING_MAX:
            self._count_dropped(data)
        else:
            self._pending += data

    def _count_dropped(self, data: bytes) -> None:
        lines = data.count(b"\n")
        self.dropped += lines
        self._dropped_since += lines

    def _arm(self) -> None:
        if self._armed or self._loop is None:
            return
        self._armed = True
        if self._loop.on_loop_thread():
            self._watch()
        else:
            self._loop.call_soon_threadsafe(lambda _arg: self._watch_locked(), None)

    def _watch_locked(self) -> None:
        with self._lock:
            self._watch()

    def _watch(self) -> None:
        if self._fd is not None and self._loop is not None and self._armed:
            self._loop.watch(self._fd, self._writable, self._on_writable)

    def _on_writable(self, fd: int, _mask: int) -> None:
        said = 0
        with self._lock:
            if fd != self._fd or self._loop is None:
                return
            try:
                del self._pending[: os.write(fd, self._pending)]
            except BlockingIOError:
                return
            except OSError:
                self._count_dropped(bytes(self._pending))
                self._pending.clear()
            if self._pending:
                return
            self._armed = False
            self._loop.unwatch(fd)
            said, self._dropped_since = self._dropped_since, 0
        if said:
            self._say_dropped(said)  # a log line: it takes the lock itself


def _nonblocking_stdout() -> tuple[int, int | None] | None:
    """A non-blocking descriptor for stdout and the flags to put back (None: its own
    open file description, nothing to put back); None when it would not help."""
    try:
        fileno = sys.stdout.fileno()
        mode = os.fstat(fileno).st_mode
    except (AttributeError, ValueError, OSError):
        return None  # not a descriptor (replaced by a test's capture)
    if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)):
        return None  # a regular file: a write never waits for a reader
    try:
        fd = os.open(f"/proc/self/fd/{fileno}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        return fd, None
    except OSError:  # a socket cannot be opened again: share its description
        fd = os.dup(fileno)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        return fd, flags
