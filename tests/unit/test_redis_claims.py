"""The store client's own bounds, with no Redis at all."""

from __future__ import annotations

import time

from dispatcher.loop import Loop
from dispatcher.metrics import Metrics
from dispatcher.redis_claims import ANSWER_BOUND, RedisClaims


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
