"""The shared dedupe store against real Redis: two replicas' claims, and the store's faults.

Each "replica" here is a ``SharedDedupe`` with its own ``RedisClaims`` (thread,
client, owner id) on one engine loop: what two processes would hold. The
normal path uses the shared Redis at 127.0.0.1:6379 under a binding name of
the test's own, deleted after; the faults use a ``redis-server`` of the
test's own, killed, paused and restarted empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis
import structlog
from prometheus_client import generate_latest

from dispatcher.delivery.dedupe import MemoryDedupe, SharedDedupe
from dispatcher.delivery.seams import Claim
from dispatcher.delivery.verdicts import DeadLetter, Failure
from dispatcher.delivery.waits import Waits
from dispatcher.loop import Loop
from dispatcher.observe.metrics import Metrics
from dispatcher.store.redis_claims import CALL_TIMEOUT, RedisClaims
from tests.support.broker import event_headers, publish, unique
from tests.support.node import free_port, make_tls_material
from tests.support.proxy import FaultProxy
from tests.support.redis_server import SHARED_URL, RedisServer, binding_keys, delete_binding_keys

pytestmark = pytest.mark.redis

KEY = ("/orders", "e-1")


class Replica:
    def __init__(self, loop: Loop, url: str, binding: str, ttl: float = 30.0) -> None:
        self.metrics = Metrics()
        self.claims = RedisClaims(url, loop, self.metrics)
        self.claims.start()
        waits = Waits(loop)
        self.dedupe = SharedDedupe(
            binding, 60.0, ttl, waits, self.claims, MemoryDedupe(60.0, waits)
        )

    def close(self) -> None:
        self.claims.close(5.0)


@pytest.fixture
def loop() -> Iterator[Loop]:
    made = Loop("test")
    yield made
    made.close()


@pytest.fixture
def binding() -> Iterator[str]:
    name = unique("dd")
    yield name
    delete_binding_keys(name)


@pytest.fixture
def replicas(loop: Loop, binding: str) -> Iterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(url: str = SHARED_URL, ttl: float = 30.0) -> Replica:
        replica = Replica(loop, url, binding, ttl)
        made.append(replica)
        return replica

    yield make
    for replica in made:
        replica.close()


def run(loop: Loop, coro: Coroutine[Any, Any, Any]) -> Any:
    return loop.run_until_complete(coro)


def test_a_redelivery_elsewhere_finds_the_event_settled(loop, replicas, binding) -> None:
    a, b = replicas(), replicas()
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert claim is not None and claim.shared is not None
    a.dedupe.release(claim, settled=True)
    assert run(loop, b.dedupe.claim_or_wait(KEY, 5.0)) == "settled"
    assert list(binding_keys(binding).values()) == ["s"]


def test_a_redelivery_waits_for_the_live_owner_then_acks(loop, replicas) -> None:
    a, b = replicas(), replicas()
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    loop.call_later(0.3, a.dedupe.release, claim, True)  # A's attempt ends while B waits
    started = time.monotonic()
    assert run(loop, b.dedupe.claim_or_wait(KEY, 10.0)) == "settled"
    assert 0.25 < time.monotonic() - started < 5


def test_a_released_claim_passes_to_the_redelivery(loop, replicas) -> None:
    a, b = replicas(), replicas()
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    loop.call_later(0.2, a.dedupe.release, claim, False)  # failed: left to the broker
    found = run(loop, b.dedupe.claim_or_wait(KEY, 10.0))
    assert isinstance(found, Claim) and found.shared is not None


def test_a_verdict_left_by_one_replica_is_the_redeliverys_on_another(loop, replicas, binding):
    """Issue 45: A's attempt ends unsettled after the subscriber's answer decided the
    event's fate; B's redelivery claims the event and finds that verdict with its
    claim, in the same round trip. A first delivery's claim (a publisher's copy)
    reads none."""
    a, b = replicas(), replicas()
    verdict = DeadLetter(Failure(400, b"no", "refused", None), 400)
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    a.dedupe.release(claim, False, verdict)
    found = run(loop, b.dedupe.claim_or_wait(KEY, 10.0))
    assert isinstance(found, Claim) and found.verdict == verdict
    b.dedupe.release(found, False)
    first = run(loop, replicas().dedupe.claim_first(KEY, 10.0))
    assert isinstance(first, Claim) and first.verdict is None
    keys = binding_keys(binding)
    [verdict_key] = [key for key in keys if key.endswith(":v")]
    assert redis.Redis.from_url(SHARED_URL).pttl(verdict_key) > 50_000  # the window, 60 s


def test_a_live_owner_past_the_wait_gives_busy_and_keeps_its_claim(loop, replicas, binding) -> None:
    a, b = replicas(), replicas()
    run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert run(loop, b.dedupe.claim_or_wait(KEY, 0.3)) == "busy"
    [held] = binding_keys(binding).values()
    assert held.startswith("c:")  # still A's: B never sends a second request


def test_a_dead_owners_claim_ends_with_its_ttl(loop, replicas) -> None:
    a, b = replicas(ttl=1.0), replicas(ttl=1.0)
    run(loop, a.dedupe.claim_first(KEY, 30.0))
    a.close()  # A dies with its claim held
    started = time.monotonic()
    found = run(loop, b.dedupe.claim_or_wait(KEY, 10.0))
    waited = time.monotonic() - started
    assert isinstance(found, Claim) and found.shared is not None
    assert 0.8 < waited < 3.0, waited


def test_only_the_owner_releases_its_claim(loop, replicas, binding) -> None:
    """A live owner renews its claim; one cut off from the store cannot, and its
    claim expires. Its release, written once the store answers it again, must not
    end the claim another replica took meanwhile."""
    path = FaultProxy(6379)
    try:
        a, b = replicas(f"redis://127.0.0.1:{path.port}/0", ttl=1.0), replicas()
        stale = run(loop, a.dedupe.claim_first(KEY, 30.0))
        path.blackhole()  # A can no longer renew
        _eventually(lambda: binding_keys(binding), lambda keys: not keys)  # its TTL passed
        fresh = run(loop, b.dedupe.claim_first(KEY, 30.0))
        assert fresh is not None and fresh.shared is not None
        a.dedupe.release(stale, False)  # A's late release must not end B's claim
        path.restore()
        deadline = time.monotonic() + 10
        while not a.claims.up and time.monotonic() < deadline:
            run(loop, loop_sleep(loop, 0.05))
        a.claims.close(5.0)  # its release written
        assert list(binding_keys(binding).values()) == [fresh.shared[1]]
    finally:
        path.close()


def test_a_publishers_duplicate_is_still_delivered(loop, replicas, binding) -> None:
    a, b = replicas(), replicas()
    first = run(loop, a.dedupe.claim_first(KEY, 30.0))
    a.dedupe.release(first, True)
    again = run(loop, b.dedupe.claim_first(KEY, 30.0))  # not a redelivery: the subscriber judges
    assert again is not None
    b.dedupe.release(again, False)  # its failure must not undo the first's settlement
    b.claims.close(5.0)
    assert list(binding_keys(binding).values()) == ["s"]


def test_a_delivery_settled_under_another_owners_claim_stays_settled(
    loop, replicas, binding
) -> None:
    """The second of the soak's windows. B's claim is in the store (a claim applied
    after its caller gave up on it, or one made while A's store did not answer A).
    A's store does not answer A's claim for the redelivery, so A's memory decides
    and A delivers; A's settlement reaches the store once it answers again. It used
    to be refused there (another owner held the key), and B's release then deleted
    the key: nothing said the event was delivered, and the next redelivery, once
    A's ack was lost to a broker fault, went to the subscriber again."""
    path = FaultProxy(6379)
    try:
        a = replicas(f"redis://127.0.0.1:{path.port}/0")
        b, c = replicas(), replicas()
        held = run(loop, b.dedupe.claim_first(KEY, 30.0))
        assert held is not None and held.shared is not None
        path.blackhole()
        found = run(loop, a.dedupe.claim_or_wait(KEY, 5.0))  # no answer: memory decides
        assert isinstance(found, Claim) and not a.claims.up
        path.restore()
        a.dedupe.release(found, True)  # delivered
        deadline = time.monotonic() + 10
        while not a.claims.up and time.monotonic() < deadline:
            run(loop, loop_sleep(loop, 0.05))
        a.claims.close(5.0)  # every queued settlement written
        b.dedupe.release(held, False)  # B's own attempt failed
        b.claims.close(5.0)
        assert list(binding_keys(binding).values()) == ["s"]
        assert run(loop, c.dedupe.claim_or_wait(KEY, 5.0)) == "settled"
    finally:
        path.close()


def test_an_idle_replica_writes_what_it_settled_as_the_store_came_back(loop, replicas) -> None:
    """The first reading of the second window: a settlement made while this replica
    still thought the store was down (just after it came back), and then no traffic
    at all. The probe finds the store on its own, and the settlement is written
    then, without waiting for another claim."""
    server = RedisServer().start()
    path = FaultProxy(server.port)
    try:
        a = replicas(f"redis://127.0.0.1:{path.port}/0")
        claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
        assert claim is not None
        path.blackhole()
        run(loop, a.dedupe.claim_first(("/orders", "during"), 30.0))  # the outage, noticed
        assert not a.claims.up
        path.restore()
        a.dedupe.release(claim, True)  # delivered before the replica noticed the store back
        started = time.monotonic()
        while "s" not in server.keys().values() and time.monotonic() - started < 10:
            run(loop, loop_sleep(loop, 0.05))  # the engine's loop runs; no claim, no message
        assert "s" in server.keys().values()
        assert time.monotonic() - started < 3.0  # a probe interval (1 s), a call, slack
    finally:
        path.close()
        server.close()


# ----------------------------------------------------------------- faults


@pytest.fixture
def server() -> Iterator[RedisServer]:
    started = RedisServer().start()
    yield started
    started.close()


def test_a_dead_store_costs_no_delivery_and_is_found_again(loop, replicas, server) -> None:
    a = replicas(server.url)
    before = run(loop, a.dedupe.claim_first(("/orders", "before"), 30.0))
    assert before is not None and before.shared is not None
    with structlog.testing.capture_logs() as logged:
        server.kill()
        started = time.monotonic()
        claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
        assert claim is not None  # delivered all the same: memory took it
        assert time.monotonic() - started < 2 * CALL_TIMEOUT + 1
        assert a.metrics.value("dispatcher_dedupe_store_up") == 0
        assert a.metrics.value("dispatcher_dedupe_store_errors_total") >= 1
        started = time.monotonic()
        for n in range(20):  # while down nobody waits for it
            run(loop, a.dedupe.claim_first(("/orders", f"down-{n}"), 30.0))
        assert time.monotonic() - started < 1.0
        # Settled during the outage: written once the store answers again.
        a.dedupe.release(before, True)
        server.start()
        deadline = time.monotonic() + 10
        while not a.claims.up and time.monotonic() < deadline:
            run(loop, loop_sleep(loop, 0.05))
        assert a.metrics.value("dispatcher_dedupe_store_up") == 1
        back = run(loop, a.dedupe.claim_first(("/orders", "after"), 30.0))
        assert back is not None and back.shared is not None
    events = [e["event"] for e in logged]
    assert events.count("dedupe store unavailable; using this process's memory") == 1
    assert events.count("dedupe store available again") == 1
    keys = _eventually(server.keys, lambda found: "s" in found.values())
    assert "s" in keys.values()


def test_a_paused_store_answers_within_the_call_timeout(loop, replicas, server) -> None:
    a = replicas(server.url)
    server.pause()
    try:
        started = time.monotonic()
        claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
        elapsed = time.monotonic() - started
    finally:
        server.resume()
    assert claim is not None
    assert elapsed < 2 * CALL_TIMEOUT + 1, elapsed
    assert a.metrics.value("dispatcher_dedupe_store_errors_total") >= 1


def test_a_paused_store_never_holds_the_loop(loop, replicas, server) -> None:
    """FIELD-NOTES invariant 4: the loop drives the store's socket, and heartbeats
    and acks share the loop. A store that takes the claim and never answers must
    not stop anything else on it: a blocking read would hold it for the call's
    timeout."""
    a = replicas(server.url)
    assert isinstance(run(loop, a.dedupe.claim_first(("/orders", "first"), 30.0)), Claim)
    server.pause()
    ticks: list[float] = []

    async def tick_while_claiming() -> Any:
        task = loop.spawn(a.dedupe.claim_first(KEY, 30.0))
        waits = Waits(loop)
        while not task.finished.done():
            before = time.monotonic()
            await waits.sleep(0.01)
            ticks.append(time.monotonic() - before)
        return await task.finished

    try:
        claim = run(loop, tick_while_claiming())
    finally:
        server.resume()
    assert isinstance(claim, Claim)  # memory decided it once the call timed out
    assert len(ticks) >= 10 and max(ticks) < 0.8 * CALL_TIMEOUT, ticks


def test_a_store_restarted_empty_takes_claims_again(loop, replicas, server) -> None:
    a = replicas(server.url)
    first = run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert first is not None and first.shared is not None
    server.kill()
    server.start()  # empty: nothing was saved
    deadline = time.monotonic() + 10
    while True:
        found = run(loop, a.dedupe.claim_first(("/orders", f"e-{time.monotonic()}"), 30.0))
        assert isinstance(found, Claim) and found.shared is not None
        if found.shared[1] in server.keys().values():  # written: the store has it
            break
        assert time.monotonic() < deadline, "no claim written after the restart"
        run(loop, loop_sleep(loop, 0.1))
    assert a.metrics.value("dispatcher_dedupe_store_up") == 1


async def loop_sleep(loop: Loop, seconds: float) -> None:
    await Waits(loop).sleep(seconds)


def _eventually(
    read: Callable[[], dict[str, str]], ok: Callable[[dict[str, str]], bool]
) -> dict[str, str]:
    deadline = time.monotonic() + 10
    while True:
        value = read()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_a_store_that_cannot_be_used_is_said_at_start_not_at_the_first_delivery(
    loop, replicas
) -> None:
    """An idle replica showed ``dispatcher_dedupe_store_up 1`` for a store nobody
    could reach until its first delivery."""
    with structlog.testing.capture_logs() as logged:
        a = replicas(f"redis://127.0.0.1:{free_port()}/0")
        deadline = time.monotonic() + 10
        while a.claims.up and time.monotonic() < deadline:
            run(loop, loop_sleep(loop, 0.05))
    assert a.metrics.value("dispatcher_dedupe_store_up") == 0
    said = [
        e for e in logged if e["event"] == "dedupe store unavailable; using this process's memory"
    ]
    assert len(said) == 1 and "ConnectionError" in said[0]["error"]


def test_a_redis_cluster_store_stays_down_and_says_why_once(loop, replicas) -> None:
    """A batch's keys span hash slots, which a Redis Cluster refuses (CROSSSLOT). A
    one-key probe passed there: the store came back every second and failed the
    next batch, two lines a second for ever, settlements never written."""
    cluster = RedisServer(cluster=True)
    cluster.start()
    try:
        admin = redis.Redis(port=cluster.port, socket_timeout=5, decode_responses=True)
        admin.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        _eventually(lambda: admin.cluster("info"), lambda info: info["cluster_state"] == "ok")
        admin.close()
        with structlog.testing.capture_logs() as logged:
            a = replicas(cluster.url)

            async def bursts() -> None:
                for n in range(12):  # over three probe intervals
                    tasks = [
                        loop.spawn(a.dedupe.claim_first(("/orders", f"{n}-{i}"), 30.0))
                        for i in range(4)
                    ]
                    for task in tasks:
                        await task.finished
                    await Waits(loop).sleep(0.25)

            run(loop, bursts())
    finally:
        cluster.close()
    events = [e["event"] for e in logged]
    assert events.count("dedupe store available again") == 0, events
    said = [
        e for e in logged if e["event"] == "dedupe store unavailable; using this process's memory"
    ]
    assert len(said) == 1 and "slot" in said[0]["error"].lower(), said
    assert a.metrics.value("dispatcher_dedupe_store_up") == 0


def test_a_claim_made_while_the_store_was_down_is_written_once_it_is_back(
    loop, replicas, server
) -> None:
    """Its delivery went on from memory; the store came back (empty) while it still
    ran, and a redelivery to another replica found no claim and was sent again."""
    a = replicas(server.url)
    server.kill()
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert isinstance(claim, Claim)  # decided by memory: the store did not answer
    server.start()
    deadline = time.monotonic() + 10
    while not any(v.startswith("c:") for v in server.keys().values()):
        assert time.monotonic() < deadline, "the claim was never written"
        run(loop, loop_sleep(loop, 0.05))
    b = replicas(server.url)
    assert run(loop, b.dedupe.claim_or_wait(KEY, 0.3)) == "busy"
    a.dedupe.release(claim, True)
    assert run(loop, b.dedupe.claim_or_wait(KEY, 5.0)) == "settled"


def test_a_claim_lives_as_long_as_its_delivery_not_only_its_ttl(loop, replicas) -> None:
    """A delivery held past its claim's TTL (a rate limit's wait, an open circuit
    breaker) lost its claim: a redelivery elsewhere was sent while it still ran."""
    a, b = replicas(ttl=0.6), replicas(ttl=0.6)
    claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert isinstance(claim, Claim)
    run(loop, loop_sleep(loop, 2.0))  # more than three TTLs
    assert run(loop, b.dedupe.claim_or_wait(KEY, 0.3)) == "busy"
    a.dedupe.release(claim, False)  # released: the redelivery goes
    assert isinstance(run(loop, b.dedupe.claim_or_wait(KEY, 5.0)), Claim)


def test_the_stores_password_is_in_no_log_line_or_metric(loop, replicas) -> None:
    dead = f"redis://:s3cret-pw@127.0.0.1:{free_port()}/0"
    # Made inside the capture: its first probe, on its own thread, says the store
    # is down as soon as it starts, maybe before this thread runs again.
    with structlog.testing.capture_logs() as logged:
        a = replicas(dead)
        claim = run(loop, a.dedupe.claim_first(KEY, 30.0))
    assert claim is not None
    [line] = [e for e in logged if e["event"].startswith("dedupe store unavailable")]
    assert line["store"] == f"redis://:***@127.0.0.1:{dead.rsplit(':', 1)[1]}"
    assert "s3cret" not in repr(logged)
    assert "s3cret" not in generate_latest(a.metrics.registry).decode()


@pytest.mark.broker
def test_a_service_whose_store_is_down_is_ready_and_delivers(run_service, make_subscriber) -> None:
    sub = make_subscriber()
    svc = run_service(sub.url, top={"dedupe": {"store": f"redis://127.0.0.1:{free_port()}/0"}})
    assert svc.service.ready()  # readiness never waits for the store
    publish(svc.queue, headers=event_headers("down-1"))
    svc.wait_events("delivered", 1)
    assert [r.headers["ce-id"] for r in sub.requests] == ["down-1"]
    assert svc.service.metrics.value("dispatcher_dedupe_store_up") == 0
    assert svc.service.metrics.value("dispatcher_dedupe_store_errors_total") >= 1


def test_a_tls_store_takes_claims_and_settlements(loop, replicas, tmp_path) -> None:
    """rediss://: the loop writes and reads the TLS connection itself, without
    blocking; 3,000 claims at once are one write of some 300 KB, and 3,000
    settlements another."""
    server = RedisServer(tls=make_tls_material(tmp_path)).start()
    try:
        a, b = replicas(server.url), replicas(server.url)
        keys = [("/orders", f"tls-{n}") for n in range(3000)]

        async def claim_all() -> list[Any]:
            tasks = [loop.spawn(a.dedupe.claim_first(key, 30.0)) for key in keys]
            return [await task.finished for task in tasks]

        claims = run(loop, claim_all())
        assert all(isinstance(c, Claim) for c in claims) and a.claims.up
        for claim in claims:
            a.dedupe.release(claim, settled=True)
        assert run(loop, b.dedupe.claim_or_wait(keys[-1], 5.0)) == "settled"
        assert list(server.keys().values()).count("s") == len(keys)
        assert a.metrics.value("dispatcher_dedupe_store_errors_total") == 0
    finally:
        server.close()


def test_the_store_is_called_per_batch_not_per_event(loop, replicas) -> None:
    """Script calls for 2,000 deliveries that start in one pass of the loop (what one
    read from the broker hands over under load), read from a store of the test's own
    (INFO commandstats): one claim and one settlement call for each event, as
    without batching, would be 4,000."""
    server = RedisServer().start()
    try:
        a = replicas(server.url)
        assert isinstance(run(loop, a.dedupe.claim_first(("/orders", "first"), 30.0)), Claim)
        with server.client() as admin:
            admin.config_resetstat()  # connected; from here on, the load's calls
        keys = [("/orders", f"rt-{n}") for n in range(2000)]

        async def deliver_all() -> None:
            tasks = [loop.spawn(a.dedupe.claim_first(key, 30.0)) for key in keys]
            claims = [await task.finished for task in tasks]
            assert all(isinstance(c, Claim) for c in claims)
            for claim in claims:
                a.dedupe.release(claim, settled=True)

        run(loop, deliver_all())
        a.close()  # every settlement written
        with server.client() as admin:
            calls = admin.info("commandstats")["cmdstat_evalsha"]["calls"]
        assert list(server.keys().values()).count("s") == len(keys)
        # 500 keys a call: 4 for the claims, 4 for the settlements (and the first's).
        assert calls <= 9, f"{calls} script calls for {len(keys)} events"
    finally:
        server.close()
