"""The delivery engine: the one loop thread every delivery runs on, and what ends with it.

The loop is the process's one working thread: pika's connections
(``broker/pika_loop.py``), libcurl's sockets, the timers of every retry, and
one ``Handler.handle`` coroutine per message in flight all run on it (each
binding's channel starts them: ``broker/channel.py``). How many deliveries
are in flight is the bindings' ``parallelism``, not a number of threads.

The engine keeps what every delivery shares with that thread: the ``Waits``
that shutdown ends all at once, the delivery lines written at the end of each
loop pass, and what must close on the loop thread as it stops (the HTTP
client, the breakers' timers).
"""

from __future__ import annotations

from collections.abc import Callable

from dispatcher.delivery.waits import Waits
from dispatcher.loop import Loop
from dispatcher.observe import logs


class Engine:
    def __init__(self) -> None:
        self.loop = Loop("engine")
        self.waits = Waits(self.loop)
        self.lines = logs.DeliveryLines()
        self._closers: list[Callable[[], None]] = []
        self.loop.at_iteration_end(self.lines.flush)

    def close_at_stop(self, close: Callable[[], None]) -> None:
        """Run ``close`` on the loop thread as the engine stops (the HTTP client)."""
        self._closers.append(close)

    # ----------------------------------------------------------------- any thread

    def start(self) -> None:
        self.loop.start()

    def give_up(self) -> None:
        """End every wait of every delivery now (the grace period is over): the
        deliveries still running end as ``LEAVE``."""
        self.loop.call_soon_threadsafe(lambda _arg: self.waits.give_up(), None)

    def stop(self, timeout: float) -> bool:
        self.loop.call_soon_threadsafe(self._close_all, None)
        return self.loop.stop(timeout)

    def _close_all(self, _arg: object) -> None:
        for close in self._closers:
            close()
