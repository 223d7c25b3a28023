"""Publishes in flight on one confirm channel, matched to the broker's answers.

Both publishers (the service's dead letters and replies, and ``replay``)
pipeline many publishes on one long-lived confirm channel instead of waiting
for each confirm in turn (a round trip per message caps one channel at about
1,600 messages/s here). This is the bookkeeping they share:

- delivery tags count from 1 on every channel, one per publish;
- ``basic.ack``/``basic.nack`` may be ``multiple`` (every tag up to it);
- a ``mandatory`` message that routes nowhere comes back as ``basic.return``
  *before* its ack. A return carries no tag, so it is matched by the message's
  key (exchange, routing key and event identity): the oldest unconfirmed
  publish with that key that has not been returned yet, since a channel
  returns messages in the order they were published.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

NACKED = "nacked by the broker"


class ConfirmWindow(Generic[T]):
    def __init__(self) -> None:
        self._tag = 0
        self._unconfirmed: dict[int, tuple[Hashable, T]] = {}  # in publish (tag) order
        self._by_key: dict[Hashable, deque[int]] = {}
        self._returned: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._unconfirmed)

    def sent(self, key: Hashable, item: T) -> int:
        """Record a publish about to go out on the channel; returns its tag."""
        self._tag += 1
        self._unconfirmed[self._tag] = (key, item)
        self._by_key.setdefault(key, deque()).append(self._tag)
        return self._tag

    def unsend(self, tag: int) -> None:
        """The publish recorded as ``tag`` (the latest) raised before it was sent."""
        key, _item = self._unconfirmed.pop(tag)
        self._forget_key(key, tag)
        self._tag -= 1

    def returned(self, key: Hashable, reason: str) -> None:
        for tag in self._by_key.get(key, ()):
            if tag not in self._returned:
                self._returned[tag] = reason
                return

    def confirmed(self, tag: int, multiple: bool, acked: bool) -> list[tuple[T, str | None]]:
        """What an ack or nack answers: each item with ``None`` (accepted) or why not."""
        if multiple:
            tags = list(itertools.takewhile(lambda t: t <= tag, self._unconfirmed))
        else:
            tags = [tag] if tag in self._unconfirmed else []
        answered: list[tuple[T, str | None]] = []
        for t in tags:
            key, item = self._unconfirmed.pop(t)
            self._forget_key(key, t)
            returned = self._returned.pop(t, None)
            answered.append((item, NACKED if not acked else returned))
        return answered

    def lost(self) -> list[T]:
        """The channel is gone: every unconfirmed item, in publish order; tags restart."""
        items = [item for _key, item in self._unconfirmed.values()]
        self._unconfirmed.clear()
        self._by_key.clear()
        self._returned.clear()
        self._tag = 0
        return items

    def _forget_key(self, key: Hashable, tag: int) -> None:
        tags = self._by_key.get(key)
        if tags is None:
            return
        try:
            tags.remove(tag)
        except ValueError:
            return
        if not tags:
            del self._by_key[key]
