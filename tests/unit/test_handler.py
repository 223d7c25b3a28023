"""Where acks are decided, without a broker: the Handler on its engine loop, with
stand-ins for the subscriber's client and the duplicate store."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.config import settings_from_dict
from dispatcher.delivery.deadletter import DeadLetterer
from dispatcher.delivery.handler import Handler
from dispatcher.delivery.reply import Replier
from dispatcher.delivery.seams import Action, Claim, Received
from dispatcher.delivery.waits import Waits
from dispatcher.event.cloudevent import AmqpMessage
from dispatcher.http.endpoint import Endpoint
from dispatcher.http.target import HttpTarget
from dispatcher.loop import Loop
from dispatcher.observe import logs
from dispatcher.observe.metrics import Metrics

EVENT_HEADERS = {"ce-specversion": "1.0", "ce-id": "e-1", "ce-source": "/s", "ce-type": "t"}


class RecordingClient:
    """The subscriber's HTTP client: records every request it is asked to send."""

    def __init__(self) -> None:
        self.posts: list[Any] = []

    async def post(self, *args: Any) -> Any:
        self.posts.append(args)
        raise AssertionError("no request may be sent")


class ClaimThenShutdown:
    """A duplicate store whose answer arrives after the shutdown grace period ended."""

    enabled = True

    def __init__(self, waits: Waits) -> None:
        self._waits = waits
        self.released: list[tuple[Claim, bool]] = []

    async def claim_first(self, key: Any, wait: float) -> Claim:
        self._waits.give_up()
        return Claim(key)

    async def claim_or_wait(self, key: Any, wait: float) -> Claim:
        self._waits.give_up()
        return Claim(key)

    def release(self, claim: Claim, settled: bool, verdict: Any = None) -> None:
        self.released.append((claim, settled))


@pytest.mark.parametrize("redelivered", [False, True])
def test_a_claim_answered_after_grace_starts_no_request(redelivered: bool) -> None:
    loop = Loop("test")
    waits = Waits(loop)
    raw = {"name": "b", "queue": "q", "subscriber": "http://127.0.0.1:1/"}
    [binding] = settings_from_dict({"bindings": [raw]}, {}).bindings
    client = RecordingClient()
    subscriber = HttpTarget(client, Endpoint(binding.subscriber), binding.delivery, waits)  # type: ignore[arg-type]
    dedupe = ClaimThenShutdown(waits)
    handler = Handler(
        binding,
        "/",
        subscriber,
        DeadLetterer(
            binding.dead_letter, binding.subscriber, "binary", None, None, 1.0, binding.name
        ),
        Replier(binding.reply, "binary", None, None, 1.0),
        dedupe,  # type: ignore[arg-type]
        Metrics().binding("b"),
        waits,
        logs.DeliveryLines(),
    )
    received = Received(1, redelivered, AmqpMessage(b"{}", EVENT_HEADERS))
    try:
        action = loop.run_until_complete(handler.handle(received))
    finally:
        loop.close()
    assert action is Action.LEAVE  # the broker redelivers it; nothing was sent
    assert client.posts == []
    [(claim, settled)] = dedupe.released
    assert (claim.key, settled) == (("/s", "e-1"), False)
