"""SIGTERM and SIGINT for every command: the first asks to stop, the second exits now.

Python handlers are not used. CPython 3.11 runs them on the main thread, when
the interpreter's "eval breaker" says a signal is pending; another thread
that takes the GIL recomputes that flag without the pending signal (it is not
the main thread, so it may not handle signals), and the main thread then goes
on into a long wait (a shutdown's grace period) without ever running the
handler: an operator's second Ctrl-C did nothing for up to a minute (seen
once in about ten runs of the second-signal test under CPU load; CPython 3.12
changed how the flag is set).

Instead the two signals are blocked in the thread that enters ``Signals``
and in every thread it starts from then on, and one thread of ours takes
them with ``sigwait``: no handler, no flag, nothing that another thread can
lose. The kernel keeps a blocked signal pending until that thread takes it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Final

SHUTDOWN_SIGNALS: Final = frozenset({signal.SIGTERM, signal.SIGINT})
# The exit status of a second signal: the work did not finish (cli's EXIT_CRASH).
EXIT_NOW: Final = 1
# Leaving the block waits this long at most for the signal thread to end.
_CLOSE_BOUND: Final = 2.0


class Signals:
    """``with Signals(on_first) as signals:``: the first SIGTERM/SIGINT sets
    ``signals.requested`` and calls ``on_first`` on a thread of its own (so it may
    block without costing the second signal); the second writes one line on
    stderr and ends the process at once with status 1, whatever the other
    threads are doing.

    Enter it on the main thread before starting any other thread. On exit the
    previous signal mask comes back, and signals that arrive later get
    Python's default behaviour again."""

    def __init__(self, on_first: Callable[[], object] | None = None) -> None:
        self.requested = threading.Event()
        self._on_first = on_first
        self._lock = threading.Lock()  # orders closing against the signal thread's exit
        self._closing = False
        self._thread: threading.Thread | None = None
        self._previous: set[int | signal.Signals] = set()

    def __enter__(self) -> Signals:
        self._previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
        try:
            self._thread = threading.Thread(target=self._take, name="signals", daemon=True)
            self._thread.start()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)
            raise
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        thread, self._thread = self._thread, None
        if thread is not None and thread.ident is not None:
            with self._lock:
                self._closing = True
                if thread.is_alive():  # it cannot end while we hold the lock
                    # Wakes it: it blocks the signal too, so its sigwait takes it.
                    signal.pthread_kill(thread.ident, signal.SIGTERM)
            thread.join(_CLOSE_BOUND)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)

    def _take(self) -> None:
        while True:
            signum = signal.sigwait(SHUTDOWN_SIGNALS)
            with self._lock:
                if self._closing:
                    return
            if self.requested.is_set():
                # Straight to the file descriptor: no lock another thread may hold.
                name = signal.Signals(signum).name
                os.write(2, f"dispatcher: second {name}, exiting now\n".encode())
                os._exit(EXIT_NOW)
            self.requested.set()
            if self._on_first is not None:
                # On a thread of its own: however long asking takes (a call into
                # Spark's JVM), this thread is back in sigwait for the second signal.
                try:
                    threading.Thread(target=self._ask, name="signals-ask", daemon=True).start()
                except RuntimeError as e:  # no thread to be had: the second signal still works
                    os.write(2, f"dispatcher: could not ask the work to stop: {e}\n".encode())

    def _ask(self) -> None:
        assert self._on_first is not None
        try:
            self._on_first()
        except Exception as e:
            os.write(2, f"dispatcher: could not ask the work to stop: {e}\n".encode())
