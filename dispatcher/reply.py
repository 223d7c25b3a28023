"""Replies: a CloudEvent in a subscriber's 2xx answer goes to ``reply.exchange``
or ``reply.url``.
"""

from __future__ import annotations

from dispatcher import http_form
from dispatcher.config import ContentMode, ReplySettings
from dispatcher.events import Event
from dispatcher.seams import ConfirmingPublisher, Result, Target, status_field


class Replier:
    def __init__(
        self,
        settings: ReplySettings,
        content_mode: ContentMode,
        target: Target | None,
        publisher: ConfirmingPublisher | None,
        publish_timeout: float,
    ) -> None:
        self._mode = content_mode
        self._target = target
        self._routing_key = settings.routing_key
        # ``exchange: ""`` is the default exchange, a real target; None is none.
        self._exchange = settings.exchange if publisher is not None else None
        self._publisher = publisher
        self._publish_timeout = publish_timeout
        self.enabled = target is not None or self._exchange is not None

    async def send(self, reply: Event) -> str | None:
        """Forward the reply; ``None`` when accepted (or nowhere to go), else why not."""
        if self._target is not None:
            outcome = await self._target.send(http_form.to_http(reply, self._mode))
            if outcome.result is Result.DELIVERED:
                return None
            last = outcome.last
            return f"reply URL answered {status_field(last.status)} ({last.error or 'HTTP'})"
        if self._exchange is not None and self._publisher is not None:
            error = await self._publisher.publish_event(
                self._exchange, self._routing_key, reply, self._publish_timeout
            )
            if error is not None:
                return f"reply publish failed: {error}"
        return None
