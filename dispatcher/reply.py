"""Replies: a CloudEvent in a subscriber's 2xx answer goes to ``reply.exchange``
or ``reply.url``.
"""

from __future__ import annotations

from dispatcher import events
from dispatcher.config import ReplySettings
from dispatcher.delivery import HttpTarget, Result
from dispatcher.errors import PublishError
from dispatcher.events import Event
from dispatcher.publisher import Publisher


class Replier:
    def __init__(
        self,
        settings: ReplySettings,
        content_mode: str,
        target: HttpTarget | None,
        publisher: Publisher | None,
        publish_timeout: float,
    ) -> None:
        self._settings = settings
        self._mode = content_mode
        self._target = target
        self._publisher = publisher
        self._publish_timeout = publish_timeout

    @property
    def enabled(self) -> bool:
        return self._target is not None or (
            self._publisher is not None and self._settings.exchange is not None
        )

    def send(self, reply: Event) -> str | None:
        """Forward the reply; ``None`` when accepted, else why not."""
        if self._target is not None:
            outcome = self._target.send(events.to_http(reply, self._mode))
            if outcome.result is Result.DELIVERED:
                return None
            return f"reply URL answered {outcome.last.status} ({outcome.last.error or 'HTTP'})"
        if self._publisher is not None and self._settings.exchange is not None:
            headers, content_type = events.to_amqp_headers(reply)
            try:
                self._publisher.publish(
                    self._settings.exchange,
                    self._settings.routing_key,
                    reply.data or b"",
                    headers,
                    content_type,
                    timeout=self._publish_timeout,
                )
            except PublishError as e:
                return f"reply publish failed: {e}"
            return None
        return None
