"""`prefetch` above `parallelism`: messages wait in the process for a slot.

Two bounds hold together: at most `parallelism` requests reach the subscriber
at once, at most `prefetch` messages are held unacked (the broker's own count
says so), through a channel close and a shutdown; a waiting message is never
sent before its turn, and one whose channel is gone is left to the broker.
"""

from __future__ import annotations

import threading

import pytest

from tests.integration.test_generations import close_channel, held_until, unacked
from tests.support.broker import publish_events, queue_depth, wait_until

pytestmark = pytest.mark.broker


def test_prefetch_holds_more_than_parallelism_runs(make_subscriber, run_service):
    release = threading.Event()
    ids = [f"p-{i:02d}" for i in range(20)]
    sub = make_subscriber(held_until(release, set(ids)))
    svc = run_service(sub.url, parallelism=2, prefetch=6, delivery={"timeout": "60s"})
    publish_events(svc.queue, ids)
    sub.wait_for(2)
    wait_until(lambda: unacked(svc.queue) == 6, message="six messages held unacked")
    assert queue_depth(svc.queue) == 14
    assert svc.value("dispatcher_inflight", binding="b") == 2
    assert len(sub.ids()) == 2  # the four waiting were not sent
    release.set()
    svc.wait_events("delivered", 20)
    wait_until(lambda: queue_depth(svc.queue) == 0 and unacked(svc.queue) == 0, 20, "a drain")
    assert sorted(sub.ids()) == ids  # each once
    assert sub.max_concurrent == 2


def test_waiting_messages_go_back_with_their_channel(make_subscriber, run_service):
    """The two running keep their slots through the close (their acks are stale);
    the four waiting are dropped, never sent, and the new channel may hold only
    what the two leave: four more, so six in all, not ten."""
    release = threading.Event()
    held = {"held-0", "held-1"}
    sub = make_subscriber(held_until(release, held))
    svc = run_service(sub.url, parallelism=2, prefetch=6, delivery={"timeout": "60s"})
    publish_events(svc.queue, sorted(held))
    sub.wait_for(2)
    others = [f"w-{i:02d}" for i in range(10)]
    publish_events(svc.queue, others)
    wait_until(lambda: unacked(svc.queue) == 6, message="six messages held unacked")
    close_channel(svc)
    # The closed channel's two deliveries still run: the held-back redeliveries of
    # held-0 and held-1 come back first (requeued messages keep their place) and
    # wait behind them with two more.
    wait_until(lambda: unacked(svc.queue) == 4, message="the new channel's four")
    assert queue_depth(svc.queue) == 12 - 4
    assert svc.value("dispatcher_inflight", binding="b") == 2
    assert sorted(sub.ids()) == sorted(held)
    release.set()
    wait_until(lambda: queue_depth(svc.queue) == 0 and unacked(svc.queue) == 0, 20, "a drain")
    wait_until(lambda: svc.events("delivered") == 12, 20, "every delivery line")
    # held-0 and held-1 were sent once: their redeliveries waited for the first
    # attempts and were suppressed as duplicates; the waiting ones were never sent
    # on the closed channel.
    assert sorted(sub.ids()) == sorted([*held, *others])
    assert svc.value("dispatcher_stale_acks_total", binding="b") == 2
    assert sub.max_concurrent == 2


def test_shutdown_starts_none_of_the_waiting(make_subscriber, run_service):
    release = threading.Event()
    sub = make_subscriber(held_until(release, {"s-0"}))
    svc = run_service(sub.url, parallelism=1, prefetch=5, delivery={"timeout": "60s"})
    publish_events(svc.queue, [f"s-{i}" for i in range(5)])
    sub.wait_for(1)
    wait_until(lambda: unacked(svc.queue) == 5, message="five messages held unacked")
    svc.service.request_stop()
    stopped = threading.Thread(target=svc.service.shutdown)
    stopped.start()
    wait_until(lambda: svc.service.supervisor.consumers() == {"b": "down"}, message="the cancel")
    release.set()
    stopped.join(30)
    assert not stopped.is_alive()
    assert sub.ids() == ["s-0"]
    assert svc.events("delivered") == 1
    wait_until(lambda: queue_depth(svc.queue) == 4, message="the four back in the queue")


def test_thousands_waiting_that_end_at_once_do_not_nest(make_subscriber, run_service):
    """A filtered event is settled within its hand-over, which starts the next
    waiting one: 3,000 of them freed at once must run one after another, not
    nest 3,000 calls deep."""
    release = threading.Event()
    sub = make_subscriber(held_until(release, {"keep"}))
    svc = run_service(
        sub.url,
        parallelism=1,
        prefetch=5000,
        filter={"attributes": {"id": "keep"}},
        delivery={"timeout": "60s"},
    )
    publish_events(svc.queue, ["keep"])
    sub.wait_for(1)
    publish_events(svc.queue, [f"f-{i:04d}" for i in range(3000)])
    wait_until(lambda: unacked(svc.queue) == 3001, 30, "every message held, one running")
    release.set()
    wait_until(lambda: svc.events("filtered") == 3000, 60, "every event filtered")
    wait_until(lambda: queue_depth(svc.queue) == 0 and unacked(svc.queue) == 0, 20, "a drain")
    assert svc.events("delivered") == 1
    assert sub.ids() == ["keep"]
