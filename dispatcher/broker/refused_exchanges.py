"""Exchanges the broker refused a publish to: failed here for a while, not sent.

One confirm channel carries every binding's dead letters and replies. A
publish to an exchange that does not exist (404), or that this user may not
write to (403: permissions, an internal exchange), makes the broker close
that channel, and every publish unconfirmed on it fails with it, whatever
binding and exchange it was for; nothing goes until the channel is reopened.
One binding with a misspelt reply exchange, replying to a few events a
second, kept the channel closed most of the time: every other binding's dead
letters and replies failed and their messages were requeued, again and again.

So an exchange the broker refused is remembered: a publish to it fails at
once with the broker's reason, without being sent, until a wait that doubles
with each refusal (1 s, up to a minute) is over; then the next publish to it
tries again, and a confirm forgets the refusal. The broker names the
exchange in its reply text (``NOT_FOUND - no exchange 'x' in vhost '/'``,
``ACCESS_REFUSED - access to exchange 'x' in vhost '/' refused for user
'u'``, ``... cannot publish to internal exchange 'x' in vhost '/'``); a
close that names none is not remembered, and behaves as before.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import pika.exceptions

from dispatcher.delivery.retry import Backoff

_WAIT: Final = Backoff("exponential", 1.0, 60.0)
_NAMED: Final = re.compile(r"exchange '(.*?)' in vhost")
_REFUSALS: Final = frozenset({403, 404})


class RefusedExchanges:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # exchange -> (the broker's reason, not tried before, refusals in a row)
        self._refused: dict[str, tuple[str, float, int]] = {}

    def refused(self, close: pika.exceptions.ChannelClosedByBroker) -> tuple[str, float] | None:
        """Remember the exchange the broker's close names: it and the wait, or None."""
        if close.reply_code not in _REFUSALS:
            return None
        named = _NAMED.search(str(close.reply_text))
        if named is None:
            return None
        exchange = named.group(1)
        times = self._refused.get(exchange, ("", 0.0, 0))[2]
        wait = _WAIT.wait(times)
        reason = f"{close.reply_code} {close.reply_text}"
        self._refused[exchange] = (reason, self._clock() + wait, times + 1)
        return exchange, wait

    def why_not(self, exchange: str) -> str | None:
        """Why a publish to ``exchange`` fails without being sent, or None: send it."""
        entry = self._refused.get(exchange)
        if entry is None:
            return None
        reason, until, _times = entry
        left = until - self._clock()
        if left <= 0:
            return None  # try it again (a new refusal waits longer)
        return (
            f"the broker refused publishing to exchange {exchange!r} ({reason}); "
            f"not tried again for {left:.1f}s"
        )

    def accepted(self, exchange: str) -> None:
        if self._refused:
            self._refused.pop(exchange, None)
