"""Verdicts kept across a redelivery (issue 45): their form in the shared store, their
memory's bounds, the dedupe claim that carries one, and the Handler carrying one out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.delivery import verdicts
from dispatcher.delivery.dedupe import MemoryDedupe
from dispatcher.delivery.seams import Action, Claim
from dispatcher.delivery.verdicts import (
    ERROR_DATA_BYTES,
    DeadLetter,
    Failure,
    ForwardReply,
    VerdictMemory,
)
from dispatcher.delivery.waits import Waits
from dispatcher.event.cloudevent import Event
from dispatcher.loop import Loop
from tests.unit.test_handler_table import (
    REPLY_EXCHANGE,
    REPLY_HEAD,
    SINK,
    ChannelGone,
    Row,
    ShutdownDuring,
    abandoned,
    config,
    failed,
    letters,
    ok,
    run,
)

KEY = ("/s", "e-1")
text = st.text(max_size=40)  # lone surrogates included: attributes may hold them


@given(
    code=st.none() | st.integers(-1, 999),
    status=st.none() | st.integers(100, 599),
    body=st.binary(max_size=2000),
    reason=st.none() | text,
    destination=st.none() | text,
)
def test_a_dead_letter_verdict_survives_the_store(code, status, body, reason, destination):
    verdict = verdicts.dead_letter(Failure(code, body, reason, destination), status)
    assert verdict.failure.body == body[:ERROR_DATA_BYTES]  # what a letter carries, no more
    assert verdicts.decode(verdicts.encode(verdict)) == verdict


@given(
    attributes=st.dictionaries(text, text, max_size=8),
    data=st.none() | st.binary(max_size=2000),
    status=st.integers(200, 299),
)
def test_a_reply_verdict_survives_the_store(attributes, data, status):
    verdict = ForwardReply(Event(attributes, data), status)
    assert verdicts.decode(verdicts.encode(verdict)) == verdict


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"[]",
        b'{"format": 2, "kind": "reply"}',
        b'{"format": 1, "kind": "other"}',
        b'{"format": 1, "kind": "dead_letter", "code": "400", "body": "", "status": 1,'
        b' "reason": null, "destination": null}',
        b'{"format": 1, "kind": "dead_letter", "code": 400, "body": "%%", "status": 1,'
        b' "reason": null, "destination": null}',
        b'{"format": 1, "kind": "reply", "status": 200, "attributes": {"id": 1}, "data": null}',
        b'{"format": 1, "kind": "reply", "status": 200, "attributes": [], "data": null}',
    ],
)
def test_anything_but_a_verdict_is_no_verdict(payload: bytes) -> None:
    """Another version's form or a damaged value: the redelivery decides afresh."""
    assert verdicts.decode(payload) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def letter(n: int, body: bytes = b"") -> DeadLetter:
    return DeadLetter(Failure(400, body, f"r{n}"), 400)


def test_the_memory_forgets_after_its_window_and_keeps_within_its_bounds() -> None:
    clock = Clock()
    memory = VerdictMemory(10.0, clock, capacity=3, max_bytes=10_000)
    for n in range(4):
        memory.remember(("/s", str(n)), letter(n))
    assert len(memory) == 3 and memory.get(("/s", "0")) is None  # the oldest went
    assert memory.get(("/s", "3")) == letter(3)
    clock.now = 10.0
    assert memory.get(("/s", "3")) is None and len(memory) == 0
    # Bytes: a large verdict pushes the older ones out; one larger than it all is not kept.
    memory.remember(("/s", "a"), letter(0, b"x" * 4000))
    memory.remember(("/s", "b"), letter(1, b"x" * 4000))
    memory.remember(("/s", "c"), letter(2, b"x" * 4000))
    assert [memory.get(("/s", k)) is not None for k in "abc"] == [False, True, True]
    memory.remember(("/s", "d"), ForwardReply(Event({}, b"x" * 20_000), 200))
    assert memory.get(("/s", "d")) is None and len(memory) == 2


def test_a_redeliverys_claim_carries_the_verdict_a_first_deliverys_does_not() -> None:
    loop = Loop("test")
    try:
        waits = Waits(loop)
        memory = MemoryDedupe(60.0, waits)
        first = loop.run_until_complete(memory.claim_first(KEY, 1.0))
        assert isinstance(first, Claim)
        memory.release(first, False, letter(1))
        again = loop.run_until_complete(memory.claim_first(KEY, 1.0))
        assert isinstance(again, Claim) and again.verdict is None  # a publisher's copy
        memory.release(again, False)  # decided nothing: the verdict stays
        redelivery = loop.run_until_complete(memory.claim_or_wait(KEY, 1.0))
        assert isinstance(redelivery, Claim) and redelivery.verdict == letter(1)
        memory.release(redelivery, True)  # carried out at last: settled, forgotten
        assert loop.run_until_complete(memory.claim_or_wait(KEY, 1.0)) == "settled"
    finally:
        loop.close()


def test_a_redelivery_dead_letters_the_first_answer_without_a_request() -> None:
    """The sink refuses the first dead letter: the message goes back with its
    verdict, and its redelivery sends the sink the same letter, not the subscriber
    a second request."""
    ran = run(
        Row(
            "dl-verdict",
            subscriber=(failed(400), ok()),
            binding=config(SINK),
            sink=(failed(500), ok()),
        ),
        messages=2,
    )
    assert ran.action is Action.ACK
    assert len(ran.subscriber.requests) == 1
    assert [(where, a["knativeerrorcode"]) for where, a in letters(ran)] == [("sink", "400")] * 2
    assert [(line["outcome"], line["attempts"], line["status"]) for line in ran.lines] == [
        ("requeued", 1, 400),
        ("dead_lettered", 0, 400),
    ]


class Answers(dict[str, Any]):
    """A publisher's answers per exchange, one after the other (the last one stays)."""

    def get(self, exchange: str, default: Any = None) -> Any:
        answers = self[exchange]
        return answers.pop(0) if len(answers) > 1 else answers[0]


def test_a_redelivery_forwards_the_reply_it_was_left_with_and_acks() -> None:
    """The reply publish failed and the message's channel went (the target gives the
    delivery up); the redelivery forwards that same reply, no second request."""
    ran = run(
        Row(
            "reply-verdict",
            subscriber=(ok(head=REPLY_HEAD), ChannelGone(), ok()),
            binding=config(REPLY_EXCHANGE),
            exchanges=Answers(replies=["channel closed", None]),
        ),
        messages=2,
    )
    assert ran.action is Action.ACK
    assert len(ran.subscriber.requests) == 1
    assert [(x, e.id) for x, _k, e in ran.publisher.published] == [("replies", "r-1")] * 2
    assert [(line["outcome"], line["attempts"], line["status"]) for line in ran.lines] == [
        ("delivered", 0, 200)
    ]


def test_a_reply_that_still_cannot_be_forwarded_is_decided_afresh() -> None:
    """Knative's rule for a reply that cannot be forwarded holds on the redelivery:
    the subscriber is asked again, and its new answer decides."""
    ran = run(
        Row(
            "reply-verdict-refused-again",
            subscriber=(ok(head=REPLY_HEAD), ChannelGone(), ok()),
            binding=config(REPLY_EXCHANGE),
            exchanges=Answers(replies=["channel closed", "nacked", None]),
        ),
        messages=2,
    )
    assert ran.action is Action.ACK
    assert len(ran.subscriber.requests) == 2  # the first delivery's, the redelivery's
    assert [line["outcome"] for line in ran.lines] == ["delivered"]
    assert ran.lines[0]["attempts"] == 1


def test_an_earlier_attempts_reply_is_no_verdict_once_a_later_answer_came() -> None:
    """Attempt 1's reply was not forwarded, attempt 2 answered 503, and shutdown
    ended the retry wait: the latest answer is no reply, so nothing is left for
    the redelivery to forward (it decides afresh)."""
    ran = run(
        Row(
            "stale-reply",
            subscriber=(ok(head=REPLY_HEAD), ShutdownDuring(abandoned(1))),
            binding=config(REPLY_EXCHANGE),
            exchanges=Answers(replies=["channel closed"]),
        )
    )
    assert ran.action is Action.LEAVE
    assert isinstance(ran.dedupe, MemoryDedupe)
    assert len(ran.dedupe._verdicts) == 0
