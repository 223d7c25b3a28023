"""The store client's own bounds, with no Redis at all."""

from __future__ import annotations

import time

import redis
import structlog
from redis.crc import key_slot

from dispatcher.loop import Loop
from dispatcher.observe.metrics import Metrics
from dispatcher.store.redis_claims import ANSWER_BOUND, PROBE_KEYS, RedisClaims


def test_a_claim_nobody_answers_is_answered_none_within_the_bound() -> None:
    # The client's thread is never started: as if it were stuck where no socket
    # timeout reaches (a host name that never resolves). The loop still answers.
    loop = Loop("test")
    claims = RedisClaims("redis://127.0.0.1:1/0", loop, Metrics())
    try:
        future = claims.claim("k", "owner", 30.0)
        loop.call_later(ANSWER_BOUND + 3, future.resolve, "never answered")

        async def answer() -> object:
            return await future

        started = time.monotonic()
        assert loop.run_until_complete(answer()) is None
        assert ANSWER_BOUND - 0.1 <= time.monotonic() - started < ANSWER_BOUND + 1
    finally:
        loop.close()


def test_the_probe_spans_two_hash_slots_as_a_batch_does() -> None:
    """So that a store that refuses a batch (a Redis Cluster: CROSSSLOT) fails the
    probe too, and stays down instead of coming back every second."""
    assert len({key_slot(key.encode()) for key in PROBE_KEYS}) == 2


def test_a_probe_whose_script_cannot_be_loaded_fails_quietly(monkeypatch) -> None:
    """``SCRIPT LOAD`` refused (an ACL without ``script``) or the connection lost
    between the probe's two calls: it was a traceback at error level every second."""

    class Refusing:
        disconnected = False

        def send_command(self, *_args: object) -> None:
            pass

        def read_response(self) -> None:
            raise redis.exceptions.NoPermissionError("no permissions to run 'script|load'")

        def disconnect(self) -> None:
            self.disconnected = True

    refusing = Refusing()
    monkeypatch.setattr(
        "dispatcher.store.redis_claims.open_connection", lambda _url, _timeout: refusing
    )
    loop = Loop("test")
    try:
        claims = RedisClaims("redis://127.0.0.1:1/0", loop, Metrics())
        with structlog.testing.capture_logs() as logged:
            claims._open()  # what the connector thread runs: raises nothing

            async def nothing() -> None:
                pass

            loop.run_until_complete(nothing())  # one pass: the inbox holds its answer
        assert not claims.up and refusing.disconnected
        assert [(e["log_level"], e["event"]) for e in logged] == [
            ("warning", "dedupe store unavailable; using this process's memory")
        ]
        assert "NoPermissionError" in logged[0]["error"]
    finally:
        loop.close()


def test_settlements_past_the_bound_drop_the_oldest_and_say_so_once(monkeypatch) -> None:
    """A long outage under load: the oldest settlements go (their events, redelivered
    elsewhere, will not be found settled), which was said nowhere."""
    monkeypatch.setattr("dispatcher.store.redis_claims.MAX_PENDING", 3)
    loop = Loop("test")
    try:
        claims = RedisClaims("redis://127.0.0.1:1/0", loop, Metrics())  # never started
        with structlog.testing.capture_logs() as logged:
            for n in range(5):
                claims.settle(f"k{n}", "owner", True, 60.0)
            claims._hand_over()
            claims.settle("k5", "owner", True, 60.0)
            claims._hand_over()
        assert [key for key, *_rest in claims._settles] == ["k3", "k4", "k5"]
        said = [e for e in logged if e["log_level"] == "warning"]
        assert [e["event"] for e in said] == [
            "dedupe store down too long: oldest settlements dropped"
        ]
    finally:
        loop.close()
