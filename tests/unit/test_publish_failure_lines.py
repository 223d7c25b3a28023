"""What the lines and reasons about a failed dead letter or reply say: whose, and why."""

from __future__ import annotations

import pika.exceptions
import structlog

from dispatcher.broker.confirm_link import _closed_why
from dispatcher.config import DeadLetterSettings
from dispatcher.delivery.deadletter import DeadLetterer
from dispatcher.delivery.seams import Response, Result, Sent
from dispatcher.delivery.verdicts import Failure
from dispatcher.event.cloudevent import Event, HttpRequestParts
from dispatcher.loop import Loop


class NoAnswer:
    """A sink that times out."""

    def deadline_seconds(self) -> float:
        return 0.1

    async def send(self, _request: HttpRequestParts, *_args: object, **_kw: object) -> Sent:
        return Sent(Result.FAILED, Response(None, error="timeout"), 1)


def test_a_dead_letter_line_names_its_binding_and_says_when_nothing_answered() -> None:
    """It said "dead-letter sink refused" (status -1) for a timeout, with no binding."""
    letterer = DeadLetterer(
        DeadLetterSettings(sink="http://dls/"),
        "http://sub/",
        "binary",
        NoAnswer(),
        None,
        1.0,
        "orders",
    )
    event = Event({"specversion": "1.0", "id": "e-1", "source": "/s", "type": "t"}, b"")
    loop = Loop("test")
    try:
        with structlog.testing.capture_logs() as logged:
            accepted = loop.run_until_complete(letterer.send(event, Failure(503, b""), {}))
    finally:
        loop.close()
    assert accepted is False
    [line] = [e for e in logged if e["event"].startswith("dead-letter sink")]
    assert line["event"] == "dead-letter sink did not answer"
    assert (line["binding"], line["status"], line["error"]) == ("orders", -1, "timeout")


def test_a_publish_lost_with_its_channel_is_told_whose_doing_it_was() -> None:
    """pika's own blocked_connection_timeout read as "closed by the broker"."""
    by_broker = pika.exceptions.ChannelClosedByBroker(404, "NOT_FOUND - no exchange 'x'")
    assert _closed_why(by_broker).startswith("channel closed by the broker: (404")
    blocked = pika.exceptions.ConnectionBlockedTimeout("Blocked connection timeout expired.")
    assert _closed_why(blocked) == (
        "connection closed: blocked by the broker (a resource alarm) past blocked_timeout"
    )
    lost = pika.exceptions.StreamLostError("Transport indicated EOF")
    assert _closed_why(lost) == "channel closed: StreamLostError: Transport indicated EOF"
