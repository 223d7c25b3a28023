"""The per-partition publisher of ``replay``, against the real broker (no Spark)."""

from __future__ import annotations

import gc
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pika
import pytest

from dispatcher.pipeline.confirms import TURN, ConfirmedPublisher, Outgoing, PublishResult
from tests.support import broker
from tests.support.proxy import FaultProxy

pytestmark = pytest.mark.broker


def records(count: int, prefix: str = "e") -> list[Outgoing]:
    return [
        Outgoing(
            key=("/tests", f"{prefix}{i}"),
            body=b'{"n": %d}' % i,
            headers={
                "ce-specversion": "1.0",
                "ce-id": f"{prefix}{i}",
                "ce-source": "/tests",
                "ce-type": "dev.tests.replayed",
            },
            content_type="application/json",
        )
        for i in range(count)
    ]


@pytest.fixture
def queue() -> Iterator[str]:
    name = broker.unique("confirms")
    with broker.channel() as ch:
        ch.queue_declare(name, durable=True)
    yield name
    with broker.channel() as ch:
        ch.queue_delete(name)


def drain(queue: str) -> list[tuple[str, int]]:
    """(ce-id, delivery_mode) of every message in the queue, acked."""
    return [(p.headers["ce-id"], p.delivery_mode) for p, _body in broker.get_all(queue)]


def params(url: str = broker.URL) -> pika.URLParameters:
    return pika.URLParameters(url)


def test_publishes_every_record_persistent_on_one_connection(queue: str) -> None:
    sent = records(3000)
    result = ConfirmedPublisher([params()], "", queue, window=200).publish(iter(sent))
    assert (result.published, result.failed, result.resent, result.connections) == (3000, 0, 0, 1)
    got = drain(queue)
    assert sorted(i for i, _ in got) == sorted(r.key[1] for r in sent)
    assert {mode for _, mode in got} == {2}


def test_each_record_carries_its_event_id_as_message_id(queue: str) -> None:
    """As Knative's publishers do; an id too long for AMQP's short string goes
    without one rather than failing the record."""
    long_id = "x" * 300
    [long_record] = records(1)
    long_record = Outgoing(
        ("/tests", long_id),
        long_record.body,
        {**long_record.headers, "ce-id": long_id},
        long_record.content_type,
    )
    result = ConfirmedPublisher([params()], "", queue).publish(iter([*records(2), long_record]))
    assert (result.published, result.failed) == (3, 0)
    got = {p.headers["ce-id"]: p.message_id for p, _body in broker.get_all(queue)}
    assert got == {"e0": "e0", "e1": "e1", long_id: None}


def test_a_connection_cut_resends_only_the_unconfirmed_tail(queue: str) -> None:
    proxy = FaultProxy(5672)
    sent = records(4000)
    window = 50

    def source() -> Iterator[Outgoing]:
        for n, record in enumerate(sent):
            if n == 2000:
                proxy.reset_all()  # mid-partition: the connection dies under the publisher
            yield record

    try:
        publisher = ConfirmedPublisher([params(proxy.url)], "", queue, window=window)
        result = publisher.publish(source())
    finally:
        proxy.close()
    assert (result.published, result.failed, result.connections) == (4000, 0, 2)
    # Only what was in flight at the cut went again, never the confirmed 1,950+.
    assert 0 < result.resent <= window
    received = Counter(i for i, _ in drain(queue))
    assert set(received) == {r.key[1] for r in sent}
    duplicates = sum(n - 1 for n in received.values())
    assert duplicates <= result.resent


def test_unroutable_records_fail_and_the_rest_are_published(queue: str) -> None:
    exchange = broker.unique("confirms-x")
    with broker.channel() as ch:
        ch.exchange_declare(exchange, "direct")
        ch.queue_bind(queue, exchange, routing_key="bound")
    try:
        routed = ConfirmedPublisher([params()], exchange, "bound").publish(records(10, "r"))
        lost = ConfirmedPublisher([params()], exchange, "nowhere").publish(records(5, "u"))
    finally:
        with broker.channel() as ch:
            ch.exchange_delete(exchange)
    assert (routed.published, routed.failed) == (10, 0)
    assert (lost.published, lost.failed) == (0, 5)
    assert list(lost.reasons) == ["unroutable: 312 NO_ROUTE"]
    assert [r.key[1] for r in lost.failed_records] == [f"u{i}" for i in range(5)]
    assert len(drain(queue)) == 10


def test_an_unreachable_broker_fails_every_record_within_the_bound() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        url = f"amqp://guest:guest@127.0.0.1:{unused.getsockname()[1]}/%2F"
    started = time.monotonic()
    result = ConfirmedPublisher(
        [params(url)], "", "anything", give_up_after=1.0, sleep=lambda s: time.sleep(min(s, 0.2))
    ).publish(records(25))
    assert time.monotonic() - started < 15
    assert (result.published, result.failed) == (0, 25)
    assert result.connections >= 2  # it retried before giving up
    (reason,) = result.reasons
    # What went wrong, not pika's empty wrapper (replay prints it and counts.json keeps it).
    assert reason.startswith("gave up: cannot connect: ConnectionRefusedError: "), reason


def test_a_dead_first_node_leads_straight_to_the_next(queue: str) -> None:
    # A cluster's nodes: the first refuses, the second takes
    # everything, and nobody waited in between (a backoff is for a whole failed round).
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        dead = f"amqp://guest:guest@127.0.0.1:{unused.getsockname()[1]}/%2F"
    slept: list[float] = []
    result = ConfirmedPublisher([params(dead), params()], "", queue, sleep=slept.append).publish(
        records(20)
    )
    assert (result.published, result.failed, result.connections) == (20, 0, 2)
    assert slept == []
    assert broker.queue_depth(queue) == 20


def test_rate_limit_spaces_publishes(queue: str) -> None:
    started = time.monotonic()
    result = ConfirmedPublisher([params()], "", queue, rate=200).publish(records(101))
    elapsed = time.monotonic() - started
    assert result.published == 101
    # 101 publishes at 200/s need at least 100 intervals of 5 ms; unlimited takes ~20 ms.
    assert elapsed >= 0.5
    assert len(drain(queue)) == 101


def test_rate_limit_keeps_one_timer_whatever_the_confirms(queue: str) -> None:
    fired = []

    class Counting(ConfirmedPublisher):
        def _on_pump_timer(self) -> None:
            fired.append(1)
            super()._on_pump_timer()

    result = Counting([params()], "", queue, rate=400).publish(records(201))
    assert result.published == 201
    # One timer per wait at most: ~200 here. Re-arming on every confirm made it
    # grow with the square of the records.
    assert len(fired) <= 260, len(fired)


def test_a_connection_cut_while_rate_limited_goes_on_publishing(queue: str) -> None:
    """A pending rate timer dies with its connection: the next connection must
    pump again, not wait forever for a timer that will never fire."""
    proxy = FaultProxy(5672)
    sent = records(60)

    def source() -> Iterator[Outgoing]:
        for n, record in enumerate(sent):
            if n == 30:
                proxy.reset_all()  # between two rate-limited publishes
            yield record

    results: list[PublishResult] = []
    publisher = ConfirmedPublisher([params(proxy.url)], "", queue, rate=50)
    worker = threading.Thread(
        target=lambda: results.append(publisher.publish(source())), daemon=True
    )
    try:
        worker.start()
        worker.join(60)  # 60 records at 50/s take ~1.2 s; a stalled publisher never ends
        assert not worker.is_alive(), "the publisher stalled after the reconnect"
    finally:
        proxy.close()
    [result] = results
    assert (result.published, result.failed, result.connections) == (60, 0, 2)
    assert {i for i, _ in drain(queue)} == {r.key[1] for r in sent}


def test_a_broker_that_never_confirms_ends_in_give_up_not_a_hang(queue: str) -> None:
    """The connection stays up (heartbeats flow) but no confirm ever comes: the
    partition must end within its give-up bound, every record failed, saying why."""
    proxy = FaultProxy(5672, drop_confirms=True)
    results: list[PublishResult] = []
    publisher = ConfirmedPublisher([params(proxy.url)], "", queue, give_up_after=1.0)
    worker = threading.Thread(
        target=lambda: results.append(publisher.publish(iter(records(5)))), daemon=True
    )
    try:
        worker.start()
        worker.join(30)  # give-up after 1 s without a confirm; a hang never ends
        assert not worker.is_alive(), "the publisher hung on a connection that never confirms"
    finally:
        proxy.close()
    [result] = results
    assert (result.published, result.failed) == (0, 5)
    assert result.reasons == {"gave up: no confirm from the broker within 1s": 5}


def test_a_record_that_cannot_be_encoded_fails_alone(queue: str) -> None:
    bad = Outgoing(("/tests", "bad"), b"{}", {"x" * 300: "v", "ce-id": "bad"}, None)
    sent = [*records(5, "a"), bad, *records(5, "b")]
    result = ConfirmedPublisher([params()], "", queue).publish(sent)
    assert (result.published, result.failed, result.connections) == (10, 1, 1)
    (reason,) = result.reasons
    assert reason.startswith("cannot be published: its header name 'xxxx")
    assert reason.endswith("is longer than an AMQP short string")
    assert sorted(i for i, _ in drain(queue)) == sorted(r.key[1] for r in sent if r is not bad)


def test_an_input_error_is_raised_not_counted_as_done(queue: str) -> None:
    def broken() -> Iterator[Outgoing]:
        yield from records(3)
        raise RuntimeError("the archive could not be read")

    with pytest.raises(RuntimeError, match="could not be read"):
        ConfirmedPublisher([params()], "", queue).publish(broken())


def test_every_connection_attempt_frees_its_sockets_and_loop() -> None:
    # Each attempt's SelectConnection owns a socket, a poller and a wake-up pipe;
    # leaving them to the garbage collector leaked them across a give-up's retries.
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        url = f"amqp://guest:guest@127.0.0.1:{unused.getsockname()[1]}/%2F"
    fds = len(os.listdir("/proc/self/fd"))
    gc.disable()
    try:
        result = ConfirmedPublisher(
            [params(url)], "", "anything", give_up_after=1.0, sleep=lambda s: time.sleep(0.05)
        ).publish(records(3))
        assert result.connections >= 5
        assert len(os.listdir("/proc/self/fd")) <= fds + 1
    finally:
        gc.enable()


def test_a_source_slow_to_give_its_first_record_costs_no_connection(queue: str) -> None:
    """A Spark partition gives its first row only once its sort has read every row,
    which can take minutes. The first record is taken before connecting: a
    connection opened first would get no heartbeats meanwhile, be closed by the
    broker, and count as a connection that made no progress (past ``give_up_after``,
    the whole partition failed)."""
    slow = 4.0  # four heartbeats of one second: the broker gives up after two

    def sorted_partition() -> Iterator[Outgoing]:
        time.sleep(slow)  # stands for the sort: nothing can be yielded before it ends
        yield from records(50)

    publisher = ConfirmedPublisher([params(broker.URL + "?heartbeat=1")], "", queue)
    result = publisher.publish(sorted_partition())
    assert (result.published, result.failed, result.resent, result.connections) == (50, 0, 0, 1)
    assert sorted(i for i, _ in drain(queue)) == sorted(r.key[1] for r in records(50))


def test_a_source_busy_between_records_gives_the_loop_its_turns(queue: str) -> None:
    """A replay partition reads copies it does not publish (rejects, duplicates,
    times outside the window) on the publisher's loop; a long run of them yields
    ``TURN`` now and then, and the loop answers heartbeats meanwhile."""
    busy = 4.0  # four heartbeats of one second: the broker gives up after two

    def skipping() -> Iterator[Outgoing | None]:
        sent = records(50)
        yield from sent[:10]
        ends = time.monotonic() + busy
        while time.monotonic() < ends:
            time.sleep(0.01)  # stands for 500 copies read and not published
            yield TURN
        yield from sent[10:]

    publisher = ConfirmedPublisher([params(broker.URL + "?heartbeat=1")], "", queue)
    result = publisher.publish(skipping())
    assert (result.published, result.failed, result.resent, result.connections) == (50, 0, 0, 1)
    assert sorted(i for i, _ in drain(queue)) == sorted(r.key[1] for r in records(50))


def test_a_turn_takes_no_rate_slot(queue: str) -> None:
    """A replay partition's TURNs (a long run of copies it does not publish) spent
    one ``--rate`` slot each: a rate-limited replay slowed by one interval per 500
    copies skipped, with nothing published in it."""
    sent = records(20)

    def with_turns() -> Iterator[Outgoing | None]:
        for record in sent:
            yield record
            yield from [TURN] * 25

    class Slots(ConfirmedPublisher):
        first: float | None = None  # the next slot when the first record came

        def _next_record(self) -> Outgoing | None:
            record = super()._next_record()
            if record is not None and self.first is None:
                self.first = self._next_slot
            return record

    publisher = Slots([params()], "", queue, rate=1000)
    result = publisher.publish(with_turns())
    assert result.published == 20 and publisher.first is not None
    # The slots taken from the first record on, however long connecting took:
    # 20 ms of them, where the 500 TURNs took 500 ms more.
    assert publisher._next_slot - publisher.first < 0.1
