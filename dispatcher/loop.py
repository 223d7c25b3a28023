"""The delivery engine's event loop: one thread, any number of deliveries in flight.

A delivery is a coroutine (``async def``) that awaits ``Future`` objects: an
HTTP attempt, a retry wait, a publisher confirm, a duplicate-suppression
claim. The loop resumes it when the future it waits on is resolved. Nothing
here blocks, and no delivery holds a thread.

Why our own loop and not asyncio: the loop is the hot path of every delivery.
Driving libcurl's multi interface with 50 POSTs in flight to a local nginx
(``tests/bench/http_engines.py``, 2 shared CPUs, median of 3) costs 24 us of
CPU per request with a coroutine per request on this loop and 56 us on
asyncio (as tornado's curl client drives it); asyncio's selector, handle and
task machinery is the difference. The loop is small on purpose: file
descriptors (epoll, else poll), timers (a heap), a ready queue, and one
thread-safe inbox.

Threads other than the loop's own talk to it only through
``call_soon_threadsafe``: items are queued and the loop is woken through a
pipe once per batch (the first item after a drain writes one byte; the rest
ride along). Everything else here is for the loop thread only.

Futures carry values, never exceptions: a failed HTTP attempt or a refused
publish is a value the awaiting code inspects. An exception escaping a
coroutine is a bug; the loop logs it and goes on with the other deliveries.

The loop knows nothing of deliveries or shutdown: the waits a delivery makes,
and their end when the shutdown grace period runs out, are
``dispatcher/delivery/waits.py``'s.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final, Generic, TypeVar

from dispatcher.observe.logs import get_logger

log = get_logger()

T = TypeVar("T")

READABLE: Final = select.POLLIN
WRITABLE: Final = select.POLLOUT
# Reported whether asked for or not: the fd's owner reads the error from it.
FAILED: Final = select.POLLERR | select.POLLHUP
_HOOKS_EVERY: Final = 32  # ready callbacks between two runs of the iteration-end hooks


class Future(Generic[T]):
    """A value that arrives later. Resolved once; later resolutions are ignored."""

    __slots__ = ("_callbacks", "_done", "_loop", "_value")

    def __init__(self, loop: Loop) -> None:
        self._loop = loop
        self._done = False
        self._value: Any = None
        self._callbacks: list[Callable[[T], object]] | None = None

    def done(self) -> bool:
        return self._done

    def result(self) -> T:
        if not self._done:
            raise RuntimeError("future not resolved yet")
        return self._value  # type: ignore[no-any-return]

    def resolve(self, value: T) -> bool:
        """Set the value; False (and nothing changes) when it was already set.

        First wins: a publish confirm that arrives after its timeout resolved
        the same future changes nothing.
        """
        if self._done:
            return False
        self._done = True
        self._value = value
        callbacks = self._callbacks
        if callbacks is not None:
            self._callbacks = None
            for callback in callbacks:
                self._loop.call_soon(callback, value)
        return True

    def on_done(self, callback: Callable[[T], object]) -> None:
        """Call ``callback(value)`` on the loop once resolved (at once if it is)."""
        if self._done:
            self._loop.call_soon(callback, self._value)
        elif self._callbacks is None:
            self._callbacks = [callback]
        else:
            self._callbacks.append(callback)

    def __await__(self) -> Generator[Future[T], None, T]:
        if not self._done:
            yield self  # the Task driving this coroutine resumes it when resolved
        return self._value  # type: ignore[no-any-return]


class Task:
    """Runs one coroutine on the loop; ``finished`` resolves with its return value.

    Each task runs in a fresh ``contextvars.Context`` of its own, as asyncio's
    tasks do: what one delivery binds for its log lines (structlog's
    contextvars) is never seen by another on the same thread.
    """

    __slots__ = ("_context", "_coro", "finished")

    def __init__(self, loop: Loop, coro: Coroutine[Future[Any], Any, Any]) -> None:
        self._coro = coro
        self._context = contextvars.Context()
        self.finished: Future[Any] = Future(loop)
        self._step(None)

    def _step(self, value: object) -> None:
        try:
            awaited = self._context.run(self._coro.send, value)
        except StopIteration as stop:
            self.finished.resolve(stop.value)
            return
        except Exception:
            log.exception("a delivery task failed")
            self.finished.resolve(None)
            return
        awaited.on_done(self._step)


class Timer:
    """A scheduled callback; ``cancel`` stops it from running."""

    __slots__ = ("args", "callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        """Run the callback, unless it was cancelled after it came due: by a callback
        that ran before it in the same pass (pika's connection-lost notice cancels
        the heartbeat timer that would send on the closed connection)."""
        if not self.cancelled:
            self.callback(*self.args)


class _Poller:
    """epoll where there is one (Linux), else poll: same masks, one interface."""

    def __init__(self) -> None:
        self._epoll = getattr(select, "epoll", None)
        self._impl: Any = self._epoll() if self._epoll is not None else select.poll()

    def register(self, fd: int, mask: int) -> None:
        self._impl.register(fd, mask)

    def modify(self, fd: int, mask: int) -> bool:
        """False when ``fd`` is not registered (any more: closing a socket drops it)."""
        try:
            self._impl.modify(fd, mask)
        except FileNotFoundError:  # epoll: ENOENT
            return False
        except KeyError:  # poll
            return False
        return True

    def unregister(self, fd: int) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):  # already closed by its owner
            self._impl.unregister(fd)

    def poll(self, timeout: float | None) -> list[tuple[int, int]]:
        if self._epoll is not None:
            return self._impl.poll(-1 if timeout is None else timeout)  # type: ignore[no-any-return]
        ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
        return self._impl.poll(ms)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._epoll is not None:
            self._impl.close()


class Loop:
    """The loop and the thread that runs it."""

    def __init__(self, name: str = "engine", clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.time = clock
        self._poller = _Poller()
        self._watched: dict[int, tuple[int, Callable[[int, int], object]]] = {}
        self._dormant: set[int] = set()  # registered, but nobody is listening (``rest``)
        self._ready: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = itertools.count()
        self._iteration_end: list[Callable[[], object]] = []
        self._flushes: list[Callable[[], object]] = []  # ``flush_soon``'s: once each
        # The inbox: the only state other threads touch, under this lock.
        self._lock = threading.Lock()
        self._inbox: list[tuple[Callable[[Any], object], Any]] = []
        self._woken = False
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.watch(self._wake_r, READABLE, self._drain_inbox)
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- any thread

    def call_soon_threadsafe(self, callback: Callable[[T], object], arg: T) -> bool:
        """Run ``callback(arg)`` on the loop; False if the loop has stopped for good."""
        with self._lock:
            if self._closed:
                return False
            self._inbox.append((callback, arg))
            if self._woken:
                return True
            self._woken = True
        with contextlib.suppress(BlockingIOError):  # the pipe is full: the loop is awake anyway
            os.write(self._wake_w, b"\0")
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
        self._thread.start()

    def _thread_main(self) -> None:
        try:
            self.run()
        finally:
            self.close()

    def stop(self, timeout: float) -> bool:
        """Stop after the current iteration; True once the thread has ended (bounded)."""
        self.call_soon_threadsafe(self.request_stop, None)
        if self._thread is None or self._thread is threading.current_thread():
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread | None:
        """The thread running the loop (``start``'s, or whoever called ``run``)."""
        return self._thread

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # ----------------------------------------------------------------- the loop thread

    def call_soon(self, callback: Callable[..., object], *args: Any) -> None:
        self._ready.append((callback, args))

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer:
        timer = Timer(self.time() + max(0.0, delay), callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._sequence), timer))
        return timer

    def create_future(self) -> Future[Any]:
        return Future(self)

    def spawn(self, coro: Coroutine[Future[Any], Any, T]) -> Task:
        return Task(self, coro)

    def watch(self, fd: int, mask: int, callback: Callable[[int, int], object]) -> None:
        """Call ``callback(fd, events)`` whenever ``fd`` is ready for ``mask``."""
        known = self._watched.get(fd)
        if known is None:
            self._poller.register(fd, mask)
        elif (known[0] != mask or fd in self._dormant) and not self._poller.modify(fd, mask):
            # A resting socket may have been closed (epoll forgets it then) and its
            # number given to a new one: re-arm it always, register it if need be.
            self._poller.register(fd, mask)
        self._watched[fd] = (mask, callback)
        self._dormant.discard(fd)

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            self._dormant.discard(fd)
            self._poller.unregister(fd)

    def rest(self, fd: int) -> None:
        """``fd`` needs no watching for now, but probably will again soon (a keep-alive
        connection between two requests). A read-only watch stays registered: no
        syscall now, one (a modify) when it is watched again, instead of an unregister
        and a register; an event meanwhile (the peer closed it) unregisters it.
        Anything else is unwatched at once: an idle socket is always writable."""
        known = self._watched.get(fd)
        if known is None:
            return
        if known[0] == READABLE:
            self._dormant.add(fd)
        else:
            self.unwatch(fd)

    def flush_soon(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once, with this iteration's end hooks (``at_iteration_end``):
        after what is ready now, before the loop polls again. Where a connection writes
        what the iteration produced: it is on the wire before the loop waits, not an
        iteration (and that iteration's work) later."""
        self._flushes.append(callback)

    def at_iteration_end(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` at the end of every iteration, after everything that was
        ready ran, and after every 32 ready callbacks of a long iteration: the place to
        write what the iteration produced as one batch (the delivery lines). (100
        responses arriving at once are 100 deliveries to finish: the first lines
        leave before the last.)"""
        self._iteration_end.append(callback)

    def run(self) -> None:
        """Run in the calling thread until ``stop`` (or ``run_until_complete``'s end)."""
        self._stopping = False
        self._thread = threading.current_thread()
        while not self._stopping:
            self._run_once()

    def run_until_complete(self, coro: Coroutine[Future[Any], Any, T]) -> T:
        """Run ``coro`` to its end in the calling thread (tools and tests)."""
        task = self.spawn(coro)
        task.finished.on_done(self.request_stop)
        self.run()
        return task.finished.result()  # type: ignore[no-any-return]

    def close(self) -> None:
        """Free the poller and the wake-up pipe; later ``call_soon_threadsafe`` returns False."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inbox.clear()
        self._poller.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run_once(self) -> None:
        events = self._poller.poll(self._timeout())
        for fd, mask in events:
            if fd in self._dormant:
                self.unwatch(fd)  # its owner is not listening: a closed idle connection
                continue
            watched = self._watched.get(fd)
            if watched is not None:
                self._guarded(watched[1], (fd, mask))
        self._run_due_timers()
        # Only what was ready when this pass began: a callback that schedules
        # another cannot starve the file descriptors.
        ready = self._ready
        for done in range(1, len(ready) + 1):
            callback, args = ready.popleft()
            self._guarded(callback, args)
            if not done % _HOOKS_EVERY:
                self._run_hooks()
        self._run_hooks()

    def _run_hooks(self) -> None:
        if self._flushes:
            flushes, self._flushes = self._flushes, []
            for flush in flushes:
                self._guarded(flush, ())
        for hook in self._iteration_end:
            self._guarded(hook, ())

    def _timeout(self) -> float | None:
        if self._ready or self._flushes or self._stopping:
            return 0.0
        timers = self._timers
        while timers and timers[0][2].cancelled:
            heapq.heappop(timers)
        if not timers:
            return None
        return max(0.0, timers[0][0] - self.time())

    def _run_due_timers(self) -> None:
        timers = self._timers
        if not timers:
            return
        now = self.time()
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            if not timer.cancelled:
                self._ready.append((timer.fire, ()))

    def _drain_inbox(self, _fd: int, _mask: int) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            items, self._inbox = self._inbox, []
            self._woken = False
        for callback, arg in items:
            self._guarded(callback, (arg,))

    def request_stop(self, _arg: object = None) -> None:
        """From the loop thread: ``run`` returns after this iteration."""
        self._stopping = True

    @staticmethod
    def _guarded(callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            callback(*args)
        except Exception:
            # A bug in one callback must not end every delivery in flight.
            log.exception("engine callback failed", callback=getattr(callback, "__qualname__", ""))
