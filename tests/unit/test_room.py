"""A binding's in-flight and prefetch accounting (``broker.room``), held to its bounds
by properties: whatever a broker does within the prefetch it was given (send,
close the channel, have consumers cancelled) and whatever order deliveries end
in, no more than ``parallelism`` run and no more than ``prefetch`` are held."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dispatcher.broker.room import Room


@dataclass
class Consumer:
    prefetch: int
    unacked: int = 0
    confirmed: bool = False


@dataclass
class Message:
    channel: int
    tag: int
    consumer: Consumer


@dataclass
class Broker:
    """The broker's side: the current channel, its consumers, what each holds."""

    channel: int = 1
    tags: int = 0
    consumers: list[Consumer] = field(default_factory=list)


class RoomMachine(RuleBasedStateMachine):
    """Drives a Room the way ``BindingChannel`` does, against a broker that sends
    a consumer a message only while it holds fewer than its prefetch."""

    @initialize(parallelism=st.integers(1, 6), extra=st.integers(0, 6))
    def start(self, parallelism: int, extra: int) -> None:
        self.room: Room[Message] = Room(parallelism, parallelism + extra)
        self.broker = Broker()
        self.running: list[Message] = []

    def fill(self) -> None:
        room = self.room.to_take()
        if room:
            self.room.taking(room)
            self.broker.consumers.append(Consumer(room))

    @rule()
    def a_consumer_is_confirmed(self) -> None:
        for consumer in self.broker.consumers:
            if not consumer.confirmed:
                consumer.confirmed = True
                self.room.consuming(consumer.prefetch)
                return

    @rule(which=st.integers(0, 20))
    def the_broker_sends(self, which: int) -> None:
        ready = [c for c in self.broker.consumers if c.confirmed and c.unacked < c.prefetch]
        if not ready:
            return
        consumer = ready[which % len(ready)]
        consumer.unacked += 1
        self.broker.tags += 1
        message = Message(self.broker.channel, self.broker.tags, consumer)
        self.room.arrived(message.tag, True)
        if self.room.waiting or not self.room.may_start():
            self.room.waiting.append(message)
        else:
            self.begin(message)

    def begin(self, message: Message) -> None:
        self.room.started()
        self.running.append(message)

    @precondition(lambda self: bool(self.running))
    @rule(which=st.integers(0, 20))
    def a_delivery_ends(self, which: int) -> None:
        message = self.running.pop(which % len(self.running))
        self.room.finished()
        current = message.channel == self.broker.channel
        self.room.released(message.tag, current)
        if current:
            message.consumer.unacked -= 1
        while self.room.waiting and self.room.may_start():
            self.begin(self.room.waiting.popleft())
        self.fill()

    @rule()
    def the_channel_opens_or_fills(self) -> None:
        self.fill()

    @rule()
    def the_channel_closes(self) -> None:
        """What it held goes back to the broker, but the deliveries still running."""
        self.room.drop_waiting()
        self.room.new_channel()
        self.broker.channel += 1
        self.broker.tags = 0  # tags restart at 1 on every channel
        self.broker.consumers = []

    @rule()
    def every_consumer_is_cancelled(self) -> None:
        """The circuit breaker opened: the broker sends nothing more on them."""
        self.broker.consumers = [c for c in self.broker.consumers if not c.confirmed]
        for consumer in self.broker.consumers:
            self.room.consuming(consumer.prefetch)  # answered with the cancels: they go too
        self.broker.consumers = []
        self.room.all_cancelled()

    @invariant()
    def no_more_run_than_parallelism(self) -> None:
        if hasattr(self, "room"):
            assert 0 <= self.room.running <= self.room.parallelism
            assert self.room.running == len(self.running)

    @invariant()
    def no_more_held_than_prefetch(self) -> None:
        if hasattr(self, "room"):
            assert 0 <= self.room.held <= self.room.prefetch
            assert self.room.held == self.room.running + len(self.room.waiting)

    @invariant()
    def a_consumer_is_given_only_free_room(self) -> None:
        if hasattr(self, "room"):
            assert self.room.orphans + self.room.given <= self.room.prefetch
            # What the channel's consumers cover is never negative: a message a
            # cancelled consumer took is nobody's, and is not taken off twice.
            assert 0 <= self.room.orphans <= self.room.held


TestRoom = RoomMachine.TestCase
TestRoom.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_ten_closes_in_a_row_hold_one_prefetch_not_ten() -> None:
    """Every slot held by a delivery of a closed channel: a new channel gets no room."""
    room: Room[str] = Room(parallelism=2, prefetch=2)
    room.taking(room.to_take())
    room.consuming(2)
    for tag in (1, 2):
        room.arrived(tag, True)
        room.started()
    for _ in range(10):
        room.new_channel()
        assert room.to_take() == 0
    room.finished()
    room.released(1, False)
    assert room.to_take() == 1  # the first consumer of a channel takes what is free


def test_more_room_goes_a_quarter_at_a_time_while_orphans_still_run() -> None:
    room: Room[str] = Room(parallelism=8, prefetch=8)
    for tag in range(1, 7):
        room.arrived(tag, True)
        room.started()
    room.new_channel()  # six deliveries of a closed channel still run
    assert room.to_take() == 2
    room.taking(2)
    room.finished()
    room.released(1, False)
    assert room.to_take() == 0  # one freed slot is less than a quarter (2)
    room.finished()
    room.released(2, False)
    assert room.to_take() == 2
