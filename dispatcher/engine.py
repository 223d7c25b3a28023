"""The delivery engine: every delivery of every binding, on one event-loop thread.

The loop is the process's one working thread: pika's connections
(``broker/pika_loop.py``), libcurl's sockets, the timers of every retry, and
one ``Handler.handle`` coroutine per message in flight all run on it. The
supervisor calls ``deliver`` as pika hands a message over; the delivery's
verdict goes back through ``apply`` (the supervisor's), which sends the ack
at once. How many deliveries are in flight is the consumers' count
(``parallelism``), not a number of threads: the thread count of the service
does not depend on ``parallelism``.

Shutdown (``service``): the supervisor stops handing messages over;
``give_up`` ends every retry and claim wait at once, so the remaining
deliveries end as ``LEAVE``; ``stop`` ends the thread.
"""

from __future__ import annotations

from collections.abc import Callable

from dispatcher import logs
from dispatcher.handler import Handler
from dispatcher.logs import get_logger
from dispatcher.loop import Loop
from dispatcher.seams import Action, Received
from dispatcher.waits import Waits

log = get_logger()

# After an unexpected error (a bug, never an input problem: those are
# dead-lettered with a reason) a message is given back after this pause.
_BUG_PAUSE = 1.0

# Where a verdict goes: the binding's name, the message, what to do with it.
Apply = Callable[[str, Received, Action], None]


class Engine:
    def __init__(self) -> None:
        self.loop = Loop("engine")
        self.waits = Waits(self.loop)
        self.lines = logs.DeliveryLines()
        self._handlers: dict[str, Handler] = {}
        self._closers: list[Callable[[], None]] = []
        self._apply: Apply = lambda _name, _received, _action: None
        self.loop.at_iteration_end(self.lines.flush)

    def add_binding(self, name: str, handler: Handler) -> None:
        self._handlers[name] = handler

    def close_at_stop(self, close: Callable[[], None]) -> None:
        """Run ``close`` on the loop thread as the engine stops (the HTTP client)."""
        self._closers.append(close)

    def apply_with(self, apply: Apply) -> None:
        """Where each verdict goes (the supervisor), as it is reached."""
        self._apply = apply

    # ----------------------------------------------------------------- any thread

    def start(self) -> None:
        self.loop.start()

    def give_up(self) -> None:
        self.loop.call_soon_threadsafe(lambda _arg: self.waits.give_up(), None)

    def stop(self, timeout: float) -> bool:
        self.loop.call_soon_threadsafe(self._close_all, None)
        return self.loop.stop(timeout)

    # ----------------------------------------------------------------- the loop thread

    def deliver(self, name: str, received: Received) -> None:
        """Start delivering ``received``: its coroutine runs until its first wait."""
        self.loop.spawn(self._deliver(name, received))

    async def _deliver(self, name: str, received: Received) -> None:
        action = Action.LEAVE
        try:
            action = await self._handlers[name].handle(received)
        except Exception:
            log.exception("handler failed", binding=name)
            # Give the message back rather than hold its prefetch slot forever.
            action = Action.REQUEUE if await self.waits.sleep(_BUG_PAUSE) else Action.LEAVE
        finally:
            self._apply(name, received, action)

    def _close_all(self, _arg: object) -> None:
        for close in self._closers:
            close()
