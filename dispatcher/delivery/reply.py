"""Replies: a CloudEvent in a subscriber's 2xx answer goes to ``reply.exchange``
or ``reply.url``.

A reply that cannot be forwarded fails the delivery attempt that produced it
(``seams.Refusal`` with ``retry``): the subscriber gets the event again within
the binding's retry budget, and after the last attempt the original event is
dead-lettered, as Knative's data plane requires. So the reply URL gets one
request per attempt, not a retry loop of its own inside each attempt.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.config import ContentMode, ReplySettings
from dispatcher.delivery.seams import ConfirmingPublisher, Refusal, Result, Target, traced_publish
from dispatcher.event import http
from dispatcher.event.cloudevent import Event


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
        self._url = settings.url
        self._target = target
        self._routing_key = settings.routing_key
        # ``exchange: ""`` is the default exchange, a real target; None is none.
        self._exchange = settings.exchange if publisher is not None else None
        self._publisher = publisher
        self._publish_timeout = publish_timeout
        self.enabled = target is not None or self._exchange is not None

    async def send(self, reply: Event, trace: Mapping[str, str]) -> Refusal | None:
        """Forward the reply with the original message's trace headers; ``None`` when
        accepted (or nowhere to go), else why not."""
        if self._target is not None:
            outcome = await self._target.send(http.to_http(reply, self._mode, trace))
            if outcome.result is Result.DELIVERED:
                return None
            last = outcome.last
            if last.status is None:
                reason = f"reply URL did not answer ({last.error or 'no answer'})"
            else:
                reason = f"reply URL answered {last.status} ({last.error or 'HTTP'})"
            return Refusal(
                reason, retry=True, status=last.status, body=last.body, destination=self._url
            )
        if self._exchange is not None and self._publisher is not None:
            error = await traced_publish(
                self._publisher,
                self._exchange,
                self._routing_key,
                reply,
                self._publish_timeout,
                trace,
                "reply",
            )
            if error is not None:
                return Refusal(f"reply publish failed: {error}", retry=True)
        return None
