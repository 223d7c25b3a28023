"""The delivery engine: every delivery of every binding, on one event-loop thread.

The supervisor (pika's thread) hands each message over with ``submit``; the
loop wakes once per batch, starts one ``Handler.handle`` coroutine per
message, and at the end of each loop iteration hands every verdict reached in
it back to the supervisor in one batch (``Verdicts``), still tagged with the
channel generation the message arrived on. How many deliveries are in
flight is the supervisor's prefetch, not a number of threads: the thread
count of the service does not depend on ``parallelism``.

Shutdown (``service``): ``begin_shutdown`` refuses new messages (they are
left unacked); ``wait_idle`` waits, bounded, for the deliveries in flight;
``give_up`` ends every retry and claim wait at once, so the remaining
deliveries end as ``LEAVE``; ``stop`` ends the thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from dispatcher import logs
from dispatcher.handler import Action, Handler, Received
from dispatcher.logs import get_logger
from dispatcher.loop import Loop
from dispatcher.metrics import BindingMetrics
from dispatcher.waits import Waits

log = get_logger()

# After an unexpected error (a bug, never an input problem: those are
# dead-lettered with a reason) a message is given back after this pause.
_BUG_PAUSE = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    binding: str
    received: Received
    action: Action


Verdicts = Callable[[list[Verdict]], None]


@dataclass(slots=True)
class _Binding:
    name: str
    handler: Handler
    in_flight: int = 0


class Engine:
    def __init__(self) -> None:
        self.loop = Loop("engine")
        self.waits = Waits(self.loop)
        self.lines = logs.DeliveryLines()
        self._bindings: dict[str, _Binding] = {}
        self._closers: list[Callable[[], None]] = []
        self._settle: Verdicts = lambda _verdicts: None
        self._verdicts: list[Verdict] = []
        self._in_flight = 0
        self._shutting_down = False
        self._idle = threading.Event()
        self.loop.at_iteration_end(self.lines.flush)
        self.loop.at_iteration_end(self._flush)

    def add_binding(self, name: str, handler: Handler, metrics: BindingMetrics) -> None:
        binding = _Binding(name, handler)
        self._bindings[name] = binding
        # Read when scraped: no gauge update (and its lock) per delivery.
        metrics.inflight.set_function(lambda: binding.in_flight)

    def close_at_stop(self, close: Callable[[], None]) -> None:
        """Run ``close`` on the loop thread as the engine stops (the HTTP client)."""
        self._closers.append(close)

    def settle_with(self, settle: Verdicts) -> None:
        """Where verdicts go (the supervisor), one batch per loop iteration."""
        self._settle = settle

    # ----------------------------------------------------------------- any thread

    def submit(self, batch: list[tuple[str, Received]]) -> None:
        """Messages from the supervisor: (binding, message) pairs, one wake-up for all."""
        if not self.loop.call_soon_threadsafe(self._start_all, batch):
            # The engine has stopped: nothing will settle them. Say so, so the
            # supervisor frees their slots; the broker redelivers the messages.
            self._settle([Verdict(name, received, Action.LEAVE) for name, received in batch])

    def start(self) -> None:
        self.loop.start()

    def begin_shutdown(self) -> None:
        self.loop.call_soon_threadsafe(self._begin_shutdown, None)

    def wait_idle(self, timeout: float) -> bool:
        """True once no delivery is in flight (after ``begin_shutdown``); bounded."""
        return self._idle.wait(timeout)

    def give_up(self) -> None:
        self.loop.call_soon_threadsafe(lambda _arg: self.waits.give_up(), None)

    def stop(self, timeout: float) -> bool:
        self.loop.call_soon_threadsafe(self._close_all, None)
        return self.loop.stop(timeout)

    # ----------------------------------------------------------------- the loop thread

    def _start_all(self, batch: list[tuple[str, Received]]) -> None:
        for name, received in batch:
            if self._shutting_down:
                self._verdicts.append(Verdict(name, received, Action.LEAVE))
                continue
            binding = self._bindings[name]
            self._in_flight += 1
            binding.in_flight += 1
            self.loop.spawn(self._deliver(binding, received))

    async def _deliver(self, binding: _Binding, received: Received) -> None:
        action = Action.LEAVE
        try:
            action = await binding.handler.handle(received)
        except Exception:
            log.exception("handler failed", binding=binding.name)
            # Give the message back rather than hold its prefetch slot forever.
            action = Action.REQUEUE if await self.waits.sleep(_BUG_PAUSE) else Action.LEAVE
        finally:
            binding.in_flight -= 1
            self._verdicts.append(Verdict(binding.name, received, action))
            self._in_flight -= 1

    def _close_all(self, _arg: object) -> None:
        for close in self._closers:
            close()

    def _begin_shutdown(self, _arg: object) -> None:
        self._shutting_down = True

    def _flush(self) -> None:
        if self._verdicts:
            verdicts, self._verdicts = self._verdicts, []
            self._settle(verdicts)
        # Idle means every verdict is with the supervisor, not only every delivery
        # over: shutdown closes the connection next, and an ack still here is lost.
        if self._shutting_down and self._in_flight == 0:
            self._idle.set()
