"""Two `dispatcher run` processes on one queue: the shared store is what stops the
duplicate a redelivery to the other replica would be (FIELD-NOTES failure 7).

Replica A reaches the shared broker through a fault proxy, so its connection
can be cut without touching the broker; B connects directly. Both share the
Redis at 127.0.0.1:6379 (or, for the control case, nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import broker
from tests.support.broker import event_headers, publish, queue_depth, wait_until
from tests.support.process import DispatcherProcess
from tests.support.proxy import FaultProxy
from tests.support.redis_server import SHARED_URL, delete_binding_keys
from tests.support.subscriber import Reply

pytestmark = [pytest.mark.fault, pytest.mark.redis, pytest.mark.broker]


def fleet_config(
    queue: str, subscriber: str, binding: str, url: str, store: str | None, timeout: str
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
        process.wait_for("consumer attached", binding=binding)
        return process

    yield {"queue": queue, "binding": binding, "start": start}
    for process in started:
        process.kill()
    broker.delete([queue])
    delete_binding_keys(binding)


@pytest.mark.parametrize("store", [SHARED_URL, None], ids=["store", "no-store"])
def test_a_redelivery_to_the_other_replica_is_not_sent_twice(fleet, make_subscriber, store):
    # A's attempt takes 3 s; everything after answers at once.
    sub = make_subscriber(lambda _r, i: Reply(200, delay=3.0 if i == 0 else 0.0))
    proxy = FaultProxy(5672)
    try:
        a = fleet["start"](
            "a", fleet_config(fleet["queue"], sub.url, fleet["binding"], proxy.url, store, "10s")
        )
        publish(fleet["queue"], headers=event_headers("fleet-1"))
        sub.wait_for(1)  # A's attempt is in flight
        b = fleet["start"](
            "b", fleet_config(fleet["queue"], sub.url, fleet["binding"], broker.URL, store, "10s")
        )
        # A loses the broker for good (its reconnects hang), with its attempt still
        # running: the broker redelivers the message to B.
        proxy.blackhole()
        proxy.reset_all()
        b.wait_for("consumer attached", binding=fleet["binding"])
        if store is None:
            # Without the store B cannot know: the subscriber sees the event twice.
            requests = sub.wait_for(2, timeout=20)
            assert [r.headers["ce-id"] for r in requests] == ["fleet-1", "fleet-1"]
            b.wait_for("delivery", ce_id="fleet-1", redelivered=True, outcome="delivered")
            return
        b.wait_for("duplicate suppressed", timeout=30, ce_id="fleet-1")
        wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
        a.wait_for("delivery", ce_id="fleet-1", outcome="delivered")  # A's attempt did finish
        assert len(sub.requests) == 1
        assert not [line for line in b.lines if line.get("event") == "delivery"]
    finally:
        proxy.close()


def test_a_dead_owners_event_is_delivered_once_its_claim_expires(fleet, make_subscriber):
    # A's attempt never gets an answer: A is killed while it waits for one.
    sub = make_subscriber(lambda _r, i: Reply(200, hang=(i == 0)))
    config = fleet_config(fleet["queue"], sub.url, fleet["binding"], broker.URL, SHARED_URL, "2s")
    a = fleet["start"]("a", config)
    publish(fleet["queue"], headers=event_headers("fleet-2"))
    [owner] = sub.wait_for(1)
    b = fleet["start"]("b", config)
    a.popen.kill()  # SIGKILL: no release, no settlement; only the claim's TTL ends it
    a.popen.wait(10)
    # The claim lasts as long as A's first attempt could: 3 x its deadline (2 s, no
    # retry) + 3 x timeout + backoff_max = 13 s after A took it.
    line = b.wait_for("delivery", timeout=40, ce_id="fleet-2", outcome="delivered")
    requests = sub.wait_for(2, timeout=5)
    waited = requests[1].at - owner.at
    wait_until(lambda: queue_depth(fleet["queue"]) == 0, 10, "the queue to drain")
    assert line["redelivered"] is True
    assert len(sub.requests) == 2  # A's (cut off) and B's: not a third
    assert 12.0 <= waited <= 20.0, waited
    print(f"\nredelivery waited {waited:.1f} s for the dead owner's claim (TTL 13 s)")
