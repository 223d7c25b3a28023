"""Replies: a CloudEvent in a subscriber's 2xx answer goes to ``reply.exchange``
or ``reply.url``.
"""

from __future__ import annotations

from dispatcher import events
from dispatcher.config import ReplySettings
from dispatcher.delivery import HttpTarget, Result
from dispatcher.errors import PublishError
from dispatcher.events import Event
from dispatcher.publisher import Publisher, exchange_target


class Replier:
    def __init__(
        self,
        settings: ReplySettings,
        content_mode: str,
        target: HttpTarget | None,
        publisher: Publisher | None,
        publish_timeout: float,
    ) -> None:
        self._mode = content_mode
        self._target = target
        self._routing_key = settings.routing_key
        self._exchange = exchange_target(publisher, settings.exchange)
        self._publish_timeout = publish_timeout
        self.enabled = target is not None or self._exchange is not None

    def send(self, reply: Event) -> str | None:
        """Forward the reply; ``None`` when accepted (or nowhere to go), else why not."""
        if self._target is not None:
            outcome = self._target.send(events.to_http(reply, self._mode))
            if outcome.result is Result.DELIVERED:
                return None
            return f"reply URL answered {outcome.last.status} ({outcome.last.error or 'HTTP'})"
        if self._exchange is not None:
            publisher, exchange = self._exchange
            try:
                publisher.publish_event(exchange, self._routing_key, reply, self._publish_timeout)
            except PublishError as e:
                return f"reply publish failed: {e}"
        return None
