"""What a dead-lettered event looks like, and sending it to the configured targets.

The event keeps every attribute and its data, and gains Knative's extensions:
``knativeerrordest`` (subscriber URL, password redacted), ``knativeerrorcode``
(last status or -1) and ``knativeerrordata`` (base64 of the response body, at
most 1024 characters), all three of one hop: when the reply URL refused the
subscriber's reply, its URL, status and body, as Knative's dispatcher reports
a failed reply. When dispatcher itself decided (a malformed message, an
invalid reply), ``dispatchererror`` says why in words. A dead letter carries
the original message's W3C trace headers, as an HTTP header to the sink and
an AMQP header on the exchange.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

from dispatcher.config import ContentMode, DeadLetterSettings, redact_url
from dispatcher.delivery.seams import (
    ConfirmingPublisher,
    Result,
    Target,
    status_field,
    traced_publish,
)
from dispatcher.delivery.verdicts import ERROR_DATA_BYTES, Failure
from dispatcher.event import http
from dispatcher.event.cloudevent import Event
from dispatcher.observe.logs import get_logger

log = get_logger()

_REASON_CHARS = 512


def dead_letter_event(event: Event, destination: str, failure: Failure) -> Event:
    extensions = {
        "knativeerrordest": redact_url(failure.destination or destination),
        "knativeerrorcode": str(status_field(failure.code)),
        "knativeerrordata": base64.b64encode(failure.body[:ERROR_DATA_BYTES]).decode("ascii"),
    }
    stamped = event.with_extensions(extensions)
    return with_reason(stamped, failure.reason) if failure.reason else stamped


def with_reason(event: Event, reason: str) -> Event:
    """``event`` with ``dispatchererror``: why dispatcher itself refused it, in words."""
    return event.with_extensions({"dispatchererror": _printable(reason)[:_REASON_CHARS]})


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else " " for c in text)


class DeadLetterer:
    """Sends to the sink and/or the exchange; accepted when at least one target accepted.

    ``exchange: ""`` is the AMQP default exchange, a real target: only ``None``
    means none is configured.
    """

    def __init__(
        self,
        settings: DeadLetterSettings,
        destination: str,
        content_mode: ContentMode,
        sink: Target | None,
        publisher: ConfirmingPublisher | None,
        publish_timeout: float,
        binding: str,
    ) -> None:
        self._binding = binding  # its log lines say whose dead letter failed
        self._destination = destination
        self._mode = content_mode
        self._sink = sink
        self._routing_key = settings.routing_key
        self._exchange = settings.exchange if publisher is not None else None
        self._publisher = publisher
        self._publish_timeout = publish_timeout
        self.has_target = sink is not None or self._exchange is not None

    async def send(self, event: Event, failure: Failure, trace: Mapping[str, str]) -> bool:
        letter = dead_letter_event(event, self._destination, failure)
        accepted = False
        if self._sink is not None:
            accepted |= await self._to_sink(self._sink, letter, trace)
        if self._exchange is not None and self._publisher is not None:
            accepted |= await self._to_exchange(self._publisher, self._exchange, letter, trace)
        return accepted

    async def _to_sink(self, sink: Target, letter: Event, trace: Mapping[str, str]) -> bool:
        outcome = await sink.send(http.to_http(letter, self._mode, trace))
        if outcome.result is Result.DELIVERED:
            return True
        if outcome.result is Result.ABANDONED:
            return False  # shutdown ended its retry wait: the message is left, not refused
        last = outcome.last
        log.warning(
            "dead-letter sink refused"
            if last.status is not None
            else "dead-letter sink did not answer",
            binding=self._binding,
            ce_id=letter.id,
            status=status_field(last.status),
            error=last.error,
        )
        return False

    async def _to_exchange(
        self,
        publisher: ConfirmingPublisher,
        exchange: str,
        letter: Event,
        trace: Mapping[str, str],
    ) -> bool:
        error = await traced_publish(
            publisher,
            exchange,
            self._routing_key,
            letter,
            self._publish_timeout,
            trace,
            "dead_letter",
        )
        if error is not None:
            log.warning(
                "dead-letter publish failed",
                binding=self._binding,
                ce_id=letter.id,
                exchange=exchange,
                error=error,
            )
            return False
        return True
