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
# The exit status of a second signal: the work did not finish.
EXIT_NOW: Final = 1


class Signals:
    """``with Signals(on_first) as signals:``: the first SIGTERM/SIGINT calls
    ``on_first`` (on the signal thread, so it must only ask, not wait), then sets
    ``signals.requested``; the second writes one line on stderr and ends the
    process at once with status 1, whatever the other threads are doing.

    Enter it on the main thread before starting any other thread. On exit the
    previous signal mask comes back, and signals that arrive later get
    Python's default behaviour again."""

    def __init__(self, on_first: Callable[[], object] | None = None) -> None:
        self.requested = threading.Event()
        self._on_first = on_first
        self._closing = False
        self._thread: threading.Thread | None = None
        self._previous: set[int | signal.Signals] = set()

    def __enter__(self) -> Signals:
        self._previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
        self._thread = threading.Thread(target=self._take, name="signals", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        thread = self._thread
        if thread is not None and thread.ident is not None:
            self._closing = True
            # Wakes the signal thread (it blocks the signal too, so sigwait takes it).
            signal.pthread_kill(thread.ident, signal.SIGTERM)
            thread.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)

    def _take(self) -> None:
        while True:
            signum = signal.sigwait(SHUTDOWN_SIGNALS)
            if self._closing:
                return
            if self.requested.is_set():
                # Straight to the file descriptor: no lock another thread may hold.
                name = signal.Signals(signum).name
                os.write(2, f"dispatcher: second {name}, exiting now\n".encode())
                os._exit(EXIT_NOW)
            if self._on_first is not None:
                try:
                    self._on_first()
                except Exception as e:  # asking to stop must never cost the second signal
                    os.write(2, f"dispatcher: could not ask the work to stop: {e}\n".encode())
            self.requested.set()
