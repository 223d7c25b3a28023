"""Two `dispatcher run` processes on one queue: the shared store is what stops the
duplicate a redelivery to the other replica would be (docs/failure-modes.md).

Both replicas consume from the start; the one the broker gave the message to
(its requests carry ``X-Replica``) is the one whose connection is cut, through
its own fault proxy (the shared broker is never touched), or which is killed.
Both share the Redis at 127.0.0.1:6379 (or, for the control case, nothing),
each through a proxy of its own where a test must decide the order in which
their claims reach it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.process import DispatcherProcess
from tests.support.proxy import FaultProxy
from tests.support.redis_server import SHARED_URL, binding_keys, delete_binding_keys
from tests.support.subscriber import Received, Reply

pytestmark = [pytest.mark.fault, pytest.mark.redis, pytest.mark.broker]


def fleet_config(
    queue: str,
    subscriber: str,
    binding: str,
    url: str,
    store: str | None,
    name: str,
    timeout: str = "2s",
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "broker": {"url": url, "reconnect": {"initial_delay": "50ms", "max_delay": "1s"}},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": "2s"},
        "bindings": [
            {
                "name": binding,
                "queue": queue,
                "subscriber": subscriber,
                "declare": {"durable": True},
                "parallelism": 5,
                # Says which replica sent a request.
                "headers": {"X-Replica": name},
                "delivery": {
                    "retry": 0,
                    "timeout": timeout,
                    "backoff_delay": "50ms",
                    "backoff_max": "1s",
                },
            }
        ],
    }
    if store is not None:
        config["dedupe"] = {"store": store}
    return config


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    queue, binding = broker.unique("fleet"), broker.unique("fleet")
    started: list[DispatcherProcess] = []

    def start(name: str, config: dict[str, Any]) -> DispatcherProcess:
        folder = tmp_path / name
        folder.mkdir()
        process = DispatcherProcess(config, folder)
        started.append(process)
        return process

    yield {"queue": queue, "binding": binding, "start": start}
    for process in started:
        process.kill()
    broker.delete([queue])
    delete_binding_keys(binding)


def start_both(fleet: dict[str, Any], sub_url: str, urls: dict[str, str], store: str | None):
    replicas = {
        name: fleet["start"](
            name, fleet_config(fleet["queue"], sub_url, fleet["binding"], url, store, name)
        )
        for name, url in urls.items()
    }
    for replica in replicas.values():
        replica.wait_for("consumer attached", binding=fleet["binding"])
    return replicas


def start_proxied(
    fleet: dict[str, Any],
    sub_url: str,
    brokers: dict[str, FaultProxy],
    stores: dict[str, FaultProxy],
    timeout: str = "2s",
) -> dict[str, DispatcherProcess]:
    """Both replicas, each reaching the broker and the shared Redis through proxies
    of its own: a test decides which of them loses which path, and when."""
    replicas = {
        name: fleet["start"](
            name,
            fleet_config(
                fleet["queue"],
                sub_url,
                fleet["binding"],
                brokers[name].url,
                f"redis://127.0.0.1:{stores[name].port}/0",
                name,
                timeout,
            ),
        )
        for name in brokers
    }
    for replica in replicas.values():
        replica.wait_for("consumer attached", binding=fleet["binding"])
    return replicas


def owner_of(requests: list[Received], event_id: str) -> tuple[str, str]:
    """(the replica that sent ``event_id`` first, the other one)."""
    first = next(r for r in requests if r.headers["ce-id"] == event_id)
    owner = first.headers["x-replica"]
    return owner, "b" if owner == "a" else "a"


@pytest.mark.parametrize("store", [SHARED_URL, None], ids=["store", "no-store"])
def test_a_redelivery_to_the_other_replica_is_not_sent_twice(fleet, make_subscriber, store):
    # The first attempt's answer is held until its replica has lost the broker.
    answer_first = threading.Event()

    def behaviour(_request: Received, index: int) -> Reply:
        if index == 0:
            answer_first.wait(30)
        return Reply(200)

    sub = make_subscriber(behaviour)
    proxies = {"a": FaultProxy(5672), "b": FaultProxy(5672)}
    try:
        replicas = start_both(fleet, sub.url, {n: p.url for n, p in proxies.items()}, store)
        publish(fleet["queue"], headers=event_headers("fleet-1"))
        [first] = sub.wait_for(1)
        owner = first.headers["x-replica"]
        other = "b" if owner == "a" else "a"
        # The owner loses the broker for good (its reconnects hang), its attempt still
        # running: the broker redelivers the message to the other replica.
        proxies[owner].blackhole()
        proxies[owner].reset_all()
        if store is None:
            # Without the store the other replica cannot know: a second request.
            second = sub.wait_for(2, timeout=20)[1]
            assert (second.headers["ce-id"], second.headers["x-replica"]) == ("fleet-1", other)
            answer_first.set()
            return
        answer_first.set()
        replicas[other].wait_for("duplicate suppressed", timeout=30, ce_id="fleet-1")
        wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
        replicas[owner].wait_for("delivery", ce_id="fleet-1", outcome="delivered")
        assert len(sub.requests) == 1
        assert not [line for line in replicas[other].lines if line.get("event") == "delivery"]
    finally:
        answer_first.set()
        for proxy in proxies.values():
            proxy.close()


def test_a_dead_owners_event_is_delivered_once_its_claim_expires(fleet, make_subscriber):
    # The first attempt never gets an answer: its replica is killed while it waits.
    sub = make_subscriber(lambda _r, i: Reply(200, hang=(i == 0)))
    replicas = start_both(fleet, sub.url, {"a": broker.URL, "b": broker.URL}, SHARED_URL)
    publish(fleet["queue"], headers=event_headers("fleet-2"))
    [first] = sub.wait_for(1)
    owner = first.headers["x-replica"]
    other = "b" if owner == "a" else "a"
    replicas[owner].popen.kill()  # SIGKILL: no release, no settlement; only the TTL ends it
    replicas[owner].popen.wait(10)
    # The claim lasts as long as the first attempt could: 3 x its deadline (2 s, no
    # retry) + 3 x timeout + backoff_max = 13 s after the owner took it.
    line = replicas[other].wait_for("delivery", timeout=40, ce_id="fleet-2", outcome="delivered")
    second = sub.wait_for(2, timeout=5)[1]
    waited = second.at - first.at
    wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
    assert line["redelivered"] is True
    assert second.headers["x-replica"] == other
    assert len(sub.requests) == 2  # the owner's (cut off) and the other's: not a third
    assert 12.0 <= waited <= 20.0, waited
    print(f"\nredelivery waited {waited:.1f} s for the dead owner's claim (TTL 13 s)")


def test_a_connection_cut_before_the_first_request_sends_nothing_twice(fleet, make_subscriber):
    """The first of the soak's two windows. The owner's claim is on its way to the
    store (held there by its proxy) when its broker connection is reset; the broker
    redelivers to the other replica, whose claim gets in first, and which delivers.
    The owner's claim then finds the key held, or settled, by the other. It used to
    send its request all the same ("a publisher's duplicate"): two requests for one
    event. Now it waits for that attempt, finds its own channel gone, and leaves the
    message to the broker, which has it back already."""
    sub = make_subscriber()
    brokers = {"a": FaultProxy(5672), "b": FaultProxy(5672)}
    stores = {"a": FaultProxy(6379), "b": FaultProxy(6379)}
    try:
        replicas = start_proxied(fleet, sub.url, brokers, stores)
        for store in stores.values():
            store.hold()
        publish(fleet["queue"], headers=event_headers("fleet-3"))
        # The owner is the replica whose claim is now held on its way to the store.
        owner = wait_until(
            lambda: next((n for n, s in stores.items() if s.held_bytes), None),
            10,
            "a claim on its way to the store",
        )
        other = "b" if owner == "a" else "a"
        brokers[owner].blackhole()  # its reconnects hang: the broker redelivers elsewhere
        brokers[owner].reset_all()
        stores[other].release()
        [first] = sub.wait_for(1, timeout=20)
        assert first.headers["x-replica"] == other
        stores[owner].release()  # the owner's claim arrives after the other's
        left = "channel closed before the request: left for redelivery"
        ended = wait_until(
            lambda: [
                line
                for line in replicas[owner].lines
                if line.get("ce_id") == "fleet-3" and line.get("event") in (left, "delivery")
            ],
            20,
            "the owner's attempt to end",
        )
        replicas[other].wait_for("delivery", ce_id="fleet-3", outcome="delivered")
        wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
        assert [(r.headers["ce-id"], r.headers["x-replica"]) for r in sub.requests] == [
            ("fleet-3", other)
        ]
        assert [line["event"] for line in ended] == [left]
    finally:
        for proxy in (*brokers.values(), *stores.values()):
            proxy.release()
            proxy.close()


def test_a_delivery_settled_while_another_replica_held_the_claim_is_never_sent_again(
    fleet, make_subscriber
):
    """The second of the soak's two windows, with two real replicas. The owner's
    request hangs; it loses the broker, which redelivers to the other, whose store
    does not answer: memory decides and the other delivers (a duplicate docs/guarantees.md
    lists: the store was unreachable). The other's settlement reaches the store once
    it answers, while the owner's claim still holds the key; the other then loses
    the broker too, so its ack never arrives, and the event goes back to the owner,
    whose first attempt now fails. That settlement used to be refused and the
    owner's release then deleted the key: the owner delivered a third time. Now the
    settlement stands, and the third delivery is acked without a request."""
    held = {"first": threading.Event(), "second": threading.Event()}

    def behaviour(request: Received, index: int) -> Reply:
        if index == 0:
            held["first"].wait(60)
            return Reply(503)  # the owner's attempt fails: it releases its claim
        if index == 1:
            held["second"].wait(60)
        return Reply(200)

    sub = make_subscriber(behaviour)
    brokers = {"a": FaultProxy(5672), "b": FaultProxy(5672)}
    stores = {"a": FaultProxy(6379), "b": FaultProxy(6379)}
    try:
        # Attempts outlast every hold here: only the test ends them.
        replicas = start_proxied(fleet, sub.url, brokers, stores, timeout="60s")
        publish(fleet["queue"], headers=event_headers("fleet-4"))
        owner, other = owner_of(sub.wait_for(1), "fleet-4")
        stores[other].blackhole()
        brokers[owner].blackhole()
        brokers[owner].reset_all()
        sub.wait_for(2, timeout=30)  # the other's request: its memory decided
        assert sub.requests[1].headers["x-replica"] == other
        stores[other].restore()
        replicas[other].wait_for("dedupe store available again", timeout=20)
        brokers[other].blackhole()  # its ack will never arrive
        brokers[other].reset_all()
        held["second"].set()
        replicas[other].wait_for("delivery", ce_id="fleet-4", outcome="delivered")
        brokers[owner].restore()  # the broker redelivers to the owner again
        wait_until(lambda: attached(replicas[owner]) == 2, 30, "the owner consuming again")
        # The other's settlement stands in the store, though the owner's claim held the key.
        wait_until(
            lambda: list(binding_keys(fleet["binding"]).values()) == ["s"],
            10,
            "the other's settlement in the store",
        )
        held["first"].set()  # the owner's attempt fails now, and releases its claim
        wait_until(lambda: queue_depth(fleet["queue"]) == 0, 30, "the queue to drain")
        replicas[owner].wait_for("duplicate suppressed", timeout=30, ce_id="fleet-4")
        assert [r.headers["x-replica"] for r in sub.requests] == [owner, other]
    finally:
        for event in held.values():
            event.set()
        for proxy in (*brokers.values(), *stores.values()):
            proxy.release()
            proxy.close()


def attached(replica: DispatcherProcess) -> int:
    return sum(1 for line in replica.lines if line.get("event") == "consumer attached")


def test_a_dead_letter_whose_confirm_was_lost_is_carried_out_by_the_other_replica(
    fleet, make_subscriber
):
    """Issue 45 across replicas. The owner's dead letter reaches the broker, its
    confirm does not, and the owner loses the broker: the message goes back and is
    redelivered to the other replica. The owner left the verdict (dead-letter, with
    the subscriber's 400) in the store beside its claim; the other finds it with its
    claim and publishes the dead letter again: a second dead letter, never a second
    request, and never an event both delivered and dead-lettered."""
    sub = make_subscriber(lambda _r, i: Reply(400) if i == 0 else Reply(200))
    dlx, dlq = broker.declare_fanout_with_queue(prefix="fleetdl")
    brokers = {name: FaultProxy(5672, drop_confirms=True) for name in ("a", "b")}
    try:
        replicas = {}
        for name, proxy in brokers.items():
            config = fleet_config(
                fleet["queue"], sub.url, fleet["binding"], proxy.url, SHARED_URL, name, "5s"
            )
            config["bindings"][0]["dead_letter"] = {"exchange": dlx}
            replicas[name] = fleet["start"](name, config)
        for replica in replicas.values():
            replica.wait_for("consumer attached", binding=fleet["binding"])
        publish(fleet["queue"], headers=event_headers("fleet-5"))
        owner, other = owner_of(sub.wait_for(1), "fleet-5")
        wait_until(lambda: queue_depth(dlq) == 1, 10, "the dead letter in its queue")
        brokers[other].pass_confirms()
        brokers[owner].blackhole()  # its reconnects hang: the broker redelivers elsewhere
        brokers[owner].reset_all()
        line = replicas[other].wait_for("delivery", timeout=30, ce_id="fleet-5")
        assert (line["outcome"], line["attempts"], line["status"]) == ("dead_lettered", 0, 400)
        wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
        assert [(r.headers["ce-id"], r.headers["x-replica"]) for r in sub.requests] == [
            ("fleet-5", owner)
        ]
        assert [p.headers["ce-knativeerrorcode"] for p, _ in broker.get_all(dlq)] == ["400"] * 2
    finally:
        for proxy in brokers.values():
            proxy.close()
        broker.delete([dlq], [dlx])
