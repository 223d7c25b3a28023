"""Field failures reproduced on a disposable RabbitMQ node (docs/failure-modes.md lists them).

Each test fails on a naive consumer: one that stops consuming after a
reconnect, acks across channel generations, blocks heartbeats on HTTP work,
aborts or repeats in-flight deliveries, leaks per reconnect, or exits when the
broker is away.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from dispatcher.observe.metrics import RECONNECT_REASONS
from tests.faults.conftest import RECOVERY_TIMES
from tests.support.broker import (
    declare_fanout_with_queue,
    event_headers,
    get_all,
    publish,
    publish_events,
    wait_until,
)
from tests.support.node import RabbitNode
from tests.support.proxy import FaultProxy
from tests.support.subscriber import Received, Reply

pytestmark = [pytest.mark.fault, pytest.mark.timeout(180)]


def total_reconnects(svc, *reasons: str) -> float:
    names = reasons or RECONNECT_REASONS
    return sum(svc.value("dispatcher_reconnects_total", reason=r) for r in names)


def slow_for(ids: set[str], seconds: float):
    def behaviour(request: Received, _i: int) -> Reply:
        return Reply(200, delay=seconds if request.headers.get("ce-id") in ids else 0.0)

    return behaviour


def assert_each_once(sub, ids: list[str]) -> None:
    received = sub.ids()
    assert sorted(received) == sorted(ids), f"subscriber saw {sorted(received)}"


def test_broker_bounce_with_deliveries_in_flight(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Failures 1 and 6: back to consuming after a restart; in-flight events arrive once."""
    slow = {"slow-0", "slow-1", "slow-2"}
    sub = make_subscriber(slow_for(slow, 20.0))
    svc = run_service(sub.url, url=live_node.url, parallelism=5, delivery={"timeout": "60s"})
    publish_events(svc.queue, sorted(slow), url=live_node.url)
    sub.wait_for(3)
    live_node.stop_app()
    wait_until(lambda: not svc.service.ready(), 10, "readiness to drop")
    time.sleep(3)  # the broker stays down a few seconds: part of the fault, not a sync
    back = live_node.start_app()
    wait_until(svc.service.ready, 30, "a consumer again after the broker came back")
    RECOVERY_TIMES.append(("bounce", time.monotonic() - back))
    assert live_node.consumers(svc.queue) == 1
    publish_events(svc.queue, ["new-0", "new-1"], url=live_node.url)
    svc.wait_events("delivered", 5, timeout=40)
    wait_until(
        lambda: svc.value("dispatcher_duplicates_suppressed_total", binding="b") == 3,
        20,
        "the three redeliveries to be suppressed",
    )
    assert_each_once(sub, [*sorted(slow), "new-0", "new-1"])
    assert svc.value("dispatcher_stale_acks_total", binding="b") == 3
    wait_until(lambda: live_node.ready_messages(svc.queue) == 0, 10, "the queue to drain")
    assert live_node.unacked(svc.queue) == 0


def test_heartbeats_flow_while_the_subscriber_takes_six_times_the_heartbeat(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Failure 5: the pika thread never waits on HTTP, so a 30 s request costs no reconnect."""
    sub = make_subscriber(lambda _r, _i: Reply(200, delay=30.0))
    svc = run_service(
        sub.url,
        url=live_node.url,
        broker_settings={"heartbeat": "5s"},
        delivery={"timeout": "60s"},
    )
    publish(svc.queue, headers=event_headers("hb-1"), url=live_node.url)
    svc.wait_events("delivered", 1, timeout=60)
    assert total_reconnects(svc) == 0
    assert sub.ids() == ["hb-1"]
    assert svc.value("dispatcher_broker_connected") == 1


def test_silent_black_hole_is_detected_by_heartbeat_and_released(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Failure 3: no FIN, no RST; the heartbeat notices, the old connection is freed."""
    proxy = FaultProxy(live_node.port)
    try:
        sub = make_subscriber()
        svc = run_service(sub.url, url=proxy.url, broker_settings={"heartbeat": "5s"})
        threads_before = threading.active_count()
        proxy.blackhole()
        wait_until(
            lambda: svc.value("dispatcher_reconnects_total", reason="heartbeat_timeout") >= 1,
            45,
            "the heartbeat to notice the silent peer",
        )
        assert not svc.service.ready()
        proxy.restore()
        back = time.monotonic()
        wait_until(svc.service.ready, 45, "a consumer again once the path returned")
        RECOVERY_TIMES.append(("black-hole", time.monotonic() - back))
        publish(svc.queue, headers=event_headers("bh-1"), url=live_node.url)
        svc.wait_events("delivered", 1)
        assert sub.ids() == ["bh-1"]
        # The old connection is gone on both ends: one consumer connection on the
        # broker (it times the silent one out too), and no extra threads here.
        wait_until(
            lambda: live_node.connection_names().count("dispatcher-consumer") == 1,
            30,
            "the broker to drop the black-holed connection",
        )
        assert threading.active_count() <= threads_before + 1  # + the subscriber's thread
    finally:
        proxy.close()


def test_prefetched_messages_survive_a_connection_loss_without_duplicates(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Failure 6: every prefetched message is delivered and acked once, none stuck."""
    sub = make_subscriber(lambda _r, _i: Reply(200, delay=0.5))
    svc = run_service(sub.url, url=live_node.url, parallelism=5)
    ids = [f"pf-{i:02d}" for i in range(30)]
    publish_events(svc.queue, ids, url=live_node.url)
    sub.wait_for(5)
    live_node.close_all_connections()
    svc.wait_events("delivered", 30, timeout=60)
    assert_each_once(sub, ids)
    assert svc.value("dispatcher_duplicates_suppressed_total", binding="b") >= 1
    wait_until(lambda: live_node.ready_messages(svc.queue) == 0, 10, "the queue to drain")
    assert live_node.unacked(svc.queue) == 0


def test_a_hundred_forced_reconnects_leak_nothing(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Failures 1 and 3: threads, descriptors, broker connections and channels stay flat."""
    sub = make_subscriber()
    svc = run_service(sub.url, url=live_node.url)
    publish(svc.queue, headers=event_headers("warm-1"), url=live_node.url)
    svc.wait_events("delivered", 1)
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    # Inside the broker: wait for our consumer, close every connection, 100 times.
    cycles = 100
    live_node.eval(
        f'QN = rabbit_misc:r(<<"/">>, queue, <<"{svc.queue}">>),'
        " Consumers = fun() -> {ok, Q} = rabbit_amqqueue:lookup(QN),"
        " length(rabbit_amqqueue:consumers(Q)) end,"
        " L = fun Loop(0) -> ok; Loop(N) -> case Consumers() of"
        " 0 -> timer:sleep(5), Loop(N);"
        ' _ -> [rabbit_networking:close_connection(P, "fault test")'
        " || P <- rabbit_networking:connections()], timer:sleep(5), Loop(N - 1) end end,"
        f" L({cycles}).",
        timeout=150,
    )
    wait_until(svc.service.ready, 30, "a consumer after the last cycle")
    assert svc.value("dispatcher_reconnects_total", reason="closed_by_broker") >= cycles
    publish(svc.queue, headers=event_headers("after-1"), url=live_node.url)
    svc.wait_events("delivered", 2)
    assert threading.active_count() <= threads + 1
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
    wait_until(
        lambda: live_node.connection_names() == ["dispatcher-consumer"],
        10,
        "exactly one consumer connection on the broker",
    )
    wait_until(lambda: live_node.channel_count() == 1, 10, "exactly one channel on the broker")


def test_broker_absent_at_start_then_ready_when_it_appears(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Dapr and Knative give up; we keep retrying, not ready, and never exit."""
    live_node.stop_app()
    sub = make_subscriber()
    svc = run_service(sub.url, url=live_node.url, wait_ready=False)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert not svc.service.ready()
        time.sleep(0.5)
    assert svc.value("dispatcher_reconnects_total", reason="connect_failed") >= 5
    back = live_node.start_app()
    wait_until(svc.service.ready, 30, "a consumer once the broker appeared")
    RECOVERY_TIMES.append(("absent-at-start", time.monotonic() - back))
    publish(svc.queue, headers=event_headers("late-1"), url=live_node.url)
    svc.wait_events("delivered", 1)


def test_queue_deleted_under_the_consumer(live_node: RabbitNode, make_subscriber, run_service):
    """Broker-side consumer cancel (aiormq #187 drops it silently): we re-declare and resume."""
    sub = make_subscriber()
    svc = run_service(sub.url, url=live_node.url)
    from tests.support.broker import channel

    with channel(live_node.url) as ch:
        ch.queue_delete(svc.queue)
    wait_until(
        lambda: svc.value("dispatcher_reconnects_total", reason="consumer_cancelled") == 1,
        10,
        "the cancel to be noticed",
    )
    wait_until(svc.service.ready, 15, "a consumer on the re-declared queue")
    publish(svc.queue, headers=event_headers("again-1"), url=live_node.url)
    svc.wait_events("delivered", 1)
    assert total_reconnects(svc, "connection_lost", "closed_by_broker") == 0


def test_tls_with_a_client_certificate(
    live_node: RabbitNode, tls_material, make_subscriber, run_service
):
    sub = make_subscriber()
    svc = run_service(
        sub.url,
        url=f"amqps://guest:guest@localhost:{live_node.tls_port}/%2F",
        broker_settings={
            "tls": {
                "ca_file": str(tls_material / "ca.pem"),
                "cert_file": str(tls_material / "client.pem"),
                "key_file": str(tls_material / "client.key"),
            }
        },
    )
    publish(svc.queue, headers=event_headers("tls-1"), url=live_node.url)
    svc.wait_events("delivered", 1)
    assert sub.ids() == ["tls-1"]


def test_a_resource_alarm_cannot_hang_dead_lettering(
    live_node: RabbitNode, make_subscriber, run_service
):
    """Connection.Blocked hangs publishes forever without blocked_connection_timeout.
    Without duplicate suppression (``dedupe_window: 0``) no verdict is kept, so the
    redelivery asks the subscriber again and its 200 needs no publish: only the
    publisher's probe can then tell that the alarm is over."""
    alarm_on, alarm_off = threading.Event(), threading.Event()

    def refuse_while_alarmed(_r: Received, _i: int) -> Reply:
        alarm_on.wait(30)
        return Reply(200 if alarm_off.is_set() else 400)

    dlx, dlq = declare_fanout_with_queue(live_node.url, prefix="alarm-dlx")
    sub = make_subscriber(refuse_while_alarmed)
    svc = run_service(
        sub.url,
        url=live_node.url,
        broker_settings={"blocked_timeout": "2s"},
        dedupe_window=0,
        dead_letter={"exchange": dlx},
        extra_queues=[dlq],
        extra_exchanges=[dlx],
        delivery={"retry": 0, "backoff_delay": "100ms", "backoff_max": "500ms", "timeout": "5s"},
    )
    publish(svc.queue, headers=event_headers("alarm-1"), url=live_node.url)
    sub.wait_for(1)
    live_node.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        alarm_on.set()
        wait_until(lambda: svc.value("dispatcher_broker_blocked") == 1, 20, "the block to show")
        svc.wait_events("requeued", 1, timeout=30)  # the blocked publish failed; not acked
        assert svc.events("dead_lettered") == 0
        alarm_off.set()  # the subscriber accepts now; delivering needs no publish
        svc.wait_events("delivered", 1, timeout=30)
        assert svc.value("dispatcher_broker_blocked") == 1  # nothing has said otherwise yet
    finally:
        alarm_off.set()
        live_node.ctl("set_vm_memory_high_watermark", "0.4")
    # No dead letter is published any more: only the publisher's probe can
    # learn that the alarm is over, and the critical alert must stop firing.
    wait_until(lambda: svc.value("dispatcher_broker_blocked") == 0, 20, "the block to clear")
    assert total_reconnects(svc, "connection_lost", "closed_by_broker", "heartbeat_timeout") == 0


def test_publishes_wait_here_while_the_broker_holds_them_not_in_the_broker(
    live_node: RabbitNode, make_subscriber, run_service
):
    """During a resource alarm each dead letter written to the blocked connection
    waited in the broker past its timeout: the message was requeued, sent again,
    dead-lettered again, and every copy went out when the alarm ended (the explorer
    saw 6 replies and a dead letter for events that were then delivered). After
    Connection.Blocked, publishes wait here and are dropped unsent at their time."""
    alarm_on = threading.Event()

    def refuse_once_alarmed(received: Received, _i: int) -> Reply:
        if received.headers["ce-id"] == "held":
            alarm_on.wait(30)  # its dead letter goes to a blocked connection
        return Reply(400)

    dlx, dlq = declare_fanout_with_queue(live_node.url, prefix="alarm-dlx")
    sub = make_subscriber(refuse_once_alarmed)
    svc = run_service(
        sub.url,
        url=live_node.url,
        broker_settings={"blocked_timeout": "60s"},  # the block is heard, not closed on
        dead_letter={"exchange": dlx},
        extra_queues=[dlq],
        extra_exchanges=[dlx],
        delivery={"retry": 0, "backoff_delay": "100ms", "backoff_max": "300ms", "timeout": "1s"},
    )
    publish(svc.queue, headers=event_headers("warm-up"), url=live_node.url)
    wait_until(lambda: live_node.ready_messages(dlq) == 1, 20, "a dead letter before the alarm")
    publish(svc.queue, headers=event_headers("held"), url=live_node.url)  # not while blocked
    wait_until(lambda: "held" in sub.ids(), 20, "the held event at the subscriber")
    live_node.ctl("set_vm_memory_high_watermark", "0.0000001")
    try:
        alarm_on.set()
        wait_until(lambda: svc.value("dispatcher_broker_blocked") == 1, 20, "the block to show")
        svc.wait_events("requeued", 4, timeout=30)  # four rounds of a dead letter not confirmed
    finally:
        live_node.ctl("set_vm_memory_high_watermark", "0.4")
    svc.wait_events("dead_lettered", 2, timeout=30)
    letters = [props.headers["ce-id"] for props, _body in get_all(dlq, url=live_node.url)]
    # The one written before the broker said it was blocked, and the one after.
    assert 1 <= letters.count("held") <= 2, letters
