"""How long a message waits before it goes back to the queue, growing with each return.

A message goes back to the broker (``basic.nack`` with requeue) only when
configured dead-letter targets all failed: nobody has taken its event, and
dropping it would lose it. The broker puts it back at the head of the queue,
so given back at once it would come straight back and loop. So each return
waits first, and the wait grows with the number of times *this event* went
back: the binding's backoff for retry number ``retry + n`` on its ``n``-th
return (0 first), capped at ``backoff_max``. A dead-letter sink that is down
for an hour then costs one request per ``backoff_max`` per message, not a
request every few hundred milliseconds.

The count is kept per binding and event (source, id) in process memory,
bounded and forgotten after a while, the way duplicate suppression remembers
events: a count that is forgotten, or a return that reaches another replica,
only starts that event's waits again at the short end, never at zero.
Every call runs on the engine loop's thread: no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Final

from dispatcher.event.cloudevent import Key

DEFAULT_CAPACITY: Final = 10_000


class RequeueCounts:
    """Per event: how many times it went back to the queue here, for ``forget_after``."""

    def __init__(
        self, forget_after: float, clock: Callable[[], float], capacity: int = DEFAULT_CAPACITY
    ) -> None:
        self._forget_after = forget_after
        self._clock = clock
        self._capacity = capacity
        self._counts: OrderedDict[Key, tuple[int, float]] = OrderedDict()  # -> (count, expiry)

    def returned(self, key: Key) -> int:
        """Count one more return of ``key``; how many came before it (0: the first)."""
        now = self._clock()
        self._expire(now)
        count, _expiry = self._counts.pop(key, (0, 0.0))
        self._counts[key] = (count + 1, now + self._forget_after)
        while len(self._counts) > self._capacity:
            self._counts.popitem(last=False)
        return count

    def settled(self, key: Key) -> None:
        """Taken at last (delivered or dead-lettered): its next return, if any, starts over."""
        if self._counts:
            self._counts.pop(key, None)

    def __len__(self) -> int:
        return len(self._counts)

    def _expire(self, now: float) -> None:
        counts = self._counts
        while counts:
            key, (_count, expiry) = next(iter(counts.items()))
            if expiry > now:
                return
            del counts[key]
