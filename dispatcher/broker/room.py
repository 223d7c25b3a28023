"""A binding's in-flight and prefetch accounting: how many messages it holds and
runs, and how much prefetch a new consumer may take. No pika here.

Two bounds, both kept across channel flaps. At most ``parallelism``
deliveries run at once; at most ``prefetch`` messages are held unacked, the
rest of them waiting here in arrival order for a slot, so a slot freed by an
action starts the next message at once instead of after a broker round trip.

A message is *held* from its arrival until its action is sent (or dropped as
stale), whatever channel it came on; *running* from its start until its
action. A delivery whose channel closed keeps running (its HTTP request is
never aborted) and keeps its slot; those of its messages still waiting are
dropped (the broker redelivers them). So the held messages of closed
channels (the *orphans*) count against the current channel's room: a broker
that closes the channel ten times in a row gets one prefetch's worth of
messages held here, not ten.

A consumer's prefetch is fixed when it starts (per-consumer qos), so room
that frees up later is taken by another consumer on the same channel
(``to_take``). When every consumer of a channel has been cancelled, the
messages it holds are covered by no prefetch any more (the *watermark*): the
room given to new consumers leaves them out.

``tests/unit/test_room.py`` holds it to both bounds by properties, against a
broker that sends each consumer what its prefetch allows.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Room(Generic[T]):
    """The counts of one binding; ``T`` is what a waiting message is (``Received``)."""

    def __init__(self, parallelism: int, prefetch: int) -> None:
        self.parallelism = parallelism
        self.prefetch = prefetch
        self.held = 0  # arrived, no action sent yet: every channel's
        self.running = 0  # of those held, the ones started
        self.waiting: deque[T] = deque()  # held, not started yet: the current channel's
        self._current = 0  # of those held, the ones this channel's consumers cover
        self._given = 0  # prefetch given to this channel's consumers, in all
        self._setting_up = 0  # of that, what consumers not confirmed yet were given
        self._last_tag = 0  # the latest delivery tag of this channel
        self._watermark = 0  # this channel's tags below it came to consumers since cancelled

    # ----------------------------------------------------------------- the channel

    def new_channel(self) -> None:
        """What belongs to one channel starts from nothing (the held stay held)."""
        self._current = self._given = self._setting_up = 0
        self._last_tag = self._watermark = 0

    def drop_waiting(self) -> None:
        """Let the waiting messages go unsent (their channel is gone or closing: the
        broker has them back)."""
        self.held -= len(self.waiting)
        self.waiting.clear()

    # ----------------------------------------------------------------- consumers

    @property
    def orphans(self) -> int:
        """Held messages no consumer of this channel covers: closed channels', and
        cancelled consumers'."""
        return self.held - self._current

    @property
    def given(self) -> int:
        """Prefetch given to this channel's consumers, set up or being set up."""
        return self._given

    def to_take(self) -> int:
        """The prefetch a new consumer on this channel may take now (0: none). The
        first takes all the room the orphans leave (at least one slot must be
        free); more are added as orphans finish, a quarter of ``prefetch`` at a
        time or the rest once they are all done: a handful of consumers per
        channel at most, never a slot left idle long."""
        room = self.prefetch - self.orphans - self._given
        step = max(1, self.prefetch // 4)
        if room < 1 or (self._given and self.orphans and room < step):
            return 0
        return room

    def taking(self, room: int) -> None:
        """A consumer of prefetch ``room`` is being set up."""
        self._given += room
        self._setting_up += room

    def consuming(self, room: int) -> None:
        """The broker confirmed that consumer."""
        self._setting_up -= room

    def all_cancelled(self) -> None:
        """No consumer is left on this channel but those still being set up: what it
        holds is covered by no prefetch."""
        self._watermark = self._last_tag + 1
        self._current, self._given = 0, self._setting_up

    # ----------------------------------------------------------------- messages

    def arrived(self, tag: int, current: bool) -> None:
        """A message came (``current``: on this channel, not a closed one)."""
        self.held += 1
        if current:
            self._current += 1
            self._last_tag = tag

    def may_start(self) -> bool:
        return self.running < self.parallelism

    def started(self) -> None:
        self.running += 1

    def finished(self) -> None:
        """A started message's delivery reached its action."""
        self.running -= 1

    def released(self, tag: int, current: bool) -> None:
        """Its action is sent (or dropped): no longer held. ``current``: it came on
        this channel."""
        self.held -= 1
        if current and tag >= self._watermark:
            self._current -= 1

    def take_waiting(self) -> list[T]:
        """The waiting messages, to be given back one by one (each ``released``)."""
        taken = list(self.waiting)
        self.waiting.clear()
        return taken
