"""The shared dedupe store's client: claims and settlements in Redis, off the engine.

redis-py's client blocks, and the engine's loop must never block, so one
thread of its own (``redis-claims``) talks to Redis. The engine's claims and
settlements go to it in batches (the first of a batch schedules one hand-over,
which runs after every callback already ready: all the deliveries one read
from the broker started), and it sends everything queued as ``EVALSHA``
calls (at most ``CHUNK`` keys each) in one pipeline: one round trip, however
many deliveries are starting. The answers come back to the loop in one
wake-up, so the store costs microseconds per delivery, not a round trip each.

Keys are ``dispatcher:dedupe:<binding>:<digest of source and id>``; a value is
``c:<owner>`` while a delivery holds it (expiring with the claim's TTL, so a
dead owner's claim ends) or ``s`` once the event is settled (expiring after
the binding's ``dedupe_window``). Only the owner's own settlement changes its
claim: the scripts compare the value, as a blind DEL or SET could end a claim
that has since passed to another replica. Beside a claim, ``<key>:v`` may hold
the verdict (``dispatcher.delivery.verdicts``) an attempt left when it ended unsettled,
for ``dedupe_window``: written in the same pipeline before the claim's release,
so a redelivery that claims the key next reads it (``GET``, in the pipeline of
its claim).

Failures never stop delivery. Every call has a short timeout
(``CALL_TIMEOUT``, no retries); a failed call resolves its claims with
``None`` (the caller falls back to in-process memory), counts
``dispatcher_dedupe_store_errors_total``, sets ``dispatcher_dedupe_store_up``
to 0 and logs once. What socket timeouts do not bound (a host name that takes
forever to resolve) the loop does: a batch's claims still unanswered after
``ANSWER_BOUND`` are answered ``None`` there (one timer per batch). While
the store is down no claim waits for it: they are answered ``None`` at once,
and a probe (a write) every ``PROBE_INTERVAL`` finds it again.
Settlements that could not be written are kept (up to ``MAX_PENDING``) and
written when it answers, so a claim made before an outage does not linger
until its TTL.

A claim lives while its delivery runs, not only for its TTL: every claim not
settled yet is written again (``_RENEW``: still ours, or gone) every third of
its TTL, and at once when the store answers again. Without that, a delivery
that started while the store was down (its claim never written), one whose
claim a store restarted empty or an eviction lost, and one held past its TTL
(a rate limit's wait, an open circuit breaker) were unprotected: a redelivery
to another replica found no claim and was sent again while the first attempt
still ran.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dispatcher.config import redact_url
from dispatcher.delivery.dedupe import CLAIMED, SETTLED
from dispatcher.loop import Future, Loop, Timer
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import Metrics

log = get_logger()

CALL_TIMEOUT: Final = 0.5  # connect, send and answer of one batch
ANSWER_BOUND: Final = 4 * CALL_TIMEOUT  # the engine's own limit on waiting for one
PROBE_INTERVAL: Final = 1.0  # while down: how often to try again
MAX_PENDING: Final = 100_000  # settlements kept across an outage
_IDLE_WAKE: Final = 1.0
# A round trip writes at most this many settlements (a backlog after an outage
# goes in several), and one script call touches at most CHUNK keys: a Lua
# script blocks the whole store while it runs, for every replica.
MAX_SETTLES_PER_CALL: Final = 5_000
# Two keys in two hash slots, as a batch's are: a Redis Cluster refuses such a
# call (CROSSSLOT) and must stay down, not pass a one-key probe and fail the
# next batch, again and again.
PROBE_KEYS: Final = ("dispatcher:dedupe-probe:1", "dispatcher:dedupe-probe:2")
CHUNK: Final = 500

# Per key (KEYS[i]) and its two arguments (owner value, TTL in ms): 1 claimed
# by us (now, or by an earlier call whose answer was lost), 2 settled, 0
# claimed by another owner.
_CLAIM: Final = """
local out = {}
for i, key in ipairs(KEYS) do
  local mine = ARGV[2 * i - 1]
  if redis.call('SET', key, mine, 'NX', 'PX', ARGV[2 * i]) then
    out[i] = 1
  else
    local held = redis.call('GET', key)
    if held == 's' then
      out[i] = 2
    elseif held == mine then
      out[i] = 1
    else
      out[i] = 0
    end
  end
end
return out
"""

# Per key and its two arguments (owner value, TTL in ms): the claim written again
# if it is still ours or gone (expired, evicted, a store restarted empty, never
# written while the store was down); a settled event or another owner's claim
# is left as it is.
_RENEW: Final = """
for i, key in ipairs(KEYS) do
  local mine = ARGV[2 * i - 1]
  local held = redis.call('GET', key)
  if held == mine or not held then
    redis.call('SET', key, mine, 'PX', ARGV[2 * i])
  end
end
return 0
"""

# Per key and three arguments (owner value, settled 1/0, window in ms): a settled
# event is marked whoever holds the key (that it was delivered is a fact no claim
# outranks: a claim another owner made, or one applied after its caller gave up on
# it, must not leave a delivered event unmarked, and then deleted by its own
# release); a released claim is deleted only if it is still ours.
_SETTLE: Final = """
for i, key in ipairs(KEYS) do
  if ARGV[3 * i - 1] == '1' then
    redis.call('SET', key, 's', 'PX', ARGV[3 * i])
  elseif redis.call('GET', key) == ARGV[3 * i - 2] then
    redis.call('DEL', key)
  end
end
return 0
"""


@dataclass(slots=True)
class _Claim:
    key: str
    owner: str
    ttl_ms: int
    future: Future[int | bytes | None]
    verdict_key: str | None = None  # read with the claim (a redelivery's)


@dataclass(slots=True)
class _Renew:
    key: str
    owner: str
    ttl_ms: int


@dataclass(slots=True)
class _Settle:
    key: str
    owner: str
    settled: bool
    window_ms: int
    verdict: tuple[str, bytes] | None = None  # (its key, its bytes): kept for the window


class RedisClaims:
    """One per service: the thread, the client and the health of the store."""

    def __init__(self, url: str, loop: Loop, metrics: Metrics) -> None:
        self._url = url
        self._loop = loop
        self._metrics = metrics
        self._up_gauge = metrics.enable_dedupe_store()
        self._client: Any = redis.Redis.from_url(
            url,
            socket_timeout=CALL_TIMEOUT,
            socket_connect_timeout=CALL_TIMEOUT,
            retry=Retry(NoBackoff(), 0),  # the timeout is the bound: no silent second try
            health_check_interval=0,
        )
        # Called by their digests: redis-py's Script objects would ask SCRIPT EXISTS
        # on every pipeline, a second round trip per batch.
        self._shas = {_CLAIM: _sha1(_CLAIM), _SETTLE: _sha1(_SETTLE), _RENEW: _sha1(_RENEW)}
        self._claims: deque[_Claim] = deque()
        self._settles: deque[_Settle] = deque()
        self._renews: list[_Renew] = []  # the latest renewal, not sent yet
        # The loop's: every claim asked for and not settled, by key: (owner, TTL ms).
        self._live: dict[str, tuple[str, int]] = {}
        self._renewal: Timer | None = None
        self._dropping = False  # settlements past MAX_PENDING dropped since the store went
        # What the loop produced since the last hand-over, which the first of
        # them schedules (a callback runs after everything already ready).
        self._new_claims: list[_Claim] = []
        self._new_settles: list[_Settle] = []
        self._scheduled = False
        self._next_probe = 0.0  # the redis thread's: no probe before this (monotonic)
        self._probe_owner = f"probe:{secrets.token_hex(4)}"
        self._ready = threading.Condition()
        self._closing = False
        # Read by the loop thread without the lock: a stale value costs one
        # claim answered from memory, or one that waits a call's timeout.
        self.up = True
        self._up_gauge.set(1)
        self._thread = threading.Thread(target=self._run, name="redis-claims", daemon=True)

    # ----------------------------------------------------------------- the loop thread

    def claim(
        self, key: str, owner: str, ttl: float, verdict_key: str | None = None
    ) -> Future[int | bytes | None]:
        """1: claimed for ``owner``; 2: settled; 0: another owner holds it; None:
        the store did not answer (resolved at once while it is known to be down).
        With ``verdict_key``: claimed, and the verdict found there (bytes)."""
        future: Future[int | bytes | None] = self._loop.create_future()
        ttl_ms = max(1, round(ttl * 1000))
        self._live[key] = (owner, ttl_ms)  # renewed until settled, answered or not
        if self._renewal is None:
            self._renewal = self._loop.call_later(ttl / 3, self._renew)
        if not self.up:
            future.resolve(None)
            return future
        self._new_claims.append(_Claim(key, owner, ttl_ms, future, verdict_key))
        self._schedule()
        return future

    def settle(
        self,
        key: str,
        owner: str,
        settled: bool,
        window: float,
        verdict: tuple[str, bytes] | None = None,
    ) -> None:
        """Mark the event settled for ``window`` (or release the claim, leaving
        ``verdict`` for the window); not awaited."""
        live = self._live.get(key)
        if live is not None and live[0] == owner:
            del self._live[key]
        window_ms = max(1, round(window * 1000))
        self._new_settles.append(_Settle(key, owner, settled, window_ms, verdict))
        self._schedule()

    def _renew(self) -> None:
        """On the loop, every third of the shortest live TTL while claims live: hand
        every live claim over to be written again (the latest renewal replaces one
        not sent yet: the store is down, or behind)."""
        self._renewal = None
        if not self._live:
            return
        renews = [_Renew(key, owner, ttl) for key, (owner, ttl) in self._live.items()]
        with self._ready:
            self._renews = renews
            self._ready.notify()
        shortest = min(ttl for _owner, ttl in self._live.values())
        self._renewal = self._loop.call_later(max(0.1, shortest / 3000), self._renew)

    def _forget(self, claims: list[tuple[str, str]]) -> None:
        for key, owner in claims:
            live = self._live.get(key)
            if live is not None and live[0] == owner:
                del self._live[key]

    def _renew_now(self, _arg: object = None) -> None:
        """The store answers again: what was claimed meanwhile is written now."""
        if self._renewal is not None:
            self._renewal.cancel()
        self._renew()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        self._scheduled = False
        if not (self._new_claims or self._new_settles):
            return
        if self._new_claims:
            unanswered = [(claim.future, None) for claim in self._new_claims]
            self._loop.call_later(ANSWER_BOUND, _resolve_all, unanswered)  # first answer wins
        with self._ready:
            self._claims.extend(self._new_claims)
            self._settles.extend(self._new_settles)
            over = len(self._settles) - MAX_PENDING
            for _ in range(over):
                self._settles.popleft()  # oldest first: its claim is the nearest to expiring
            self._ready.notify()
        if over > 0 and not self._dropping:
            # Their events, redelivered to another replica, will not be found settled.
            self._dropping = True  # said once an outage (the store's return says it again)
            log.warning("dedupe store down too long: oldest settlements dropped", kept=MAX_PENDING)
        self._new_claims = []
        self._new_settles = []

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Write what is queued (bounded by ``timeout``), then stop. Claims still
        unanswered get ``None``: every claim's future is resolved."""
        loop_thread = self._loop.thread
        if loop_thread is None or not loop_thread.is_alive():
            self._hand_over()  # what the stopped loop produced last (its state, now idle)
        if self._renewal is not None:
            self._renewal.cancel()
        with self._ready:
            self._closing = True
            self._ready.notify()
        self._thread.join(timeout)
        with self._ready:
            left = list(self._claims)
            self._claims.clear()
        self._answer(left, None)
        self._client.close()

    # ----------------------------------------------------------------- the redis thread

    def _run(self) -> None:
        try:
            self._try_probe()  # said now, not at the first delivery: the gauge tells the truth
        except (redis.RedisError, OSError) as e:
            self._failed(e)
        while True:
            claims: list[_Claim] = []
            try:
                claims, settles, renews, closing = self._take()
                if claims or settles or renews:
                    self._call(claims, settles, renews)
                if closing:
                    if not self.up or not self._pending():
                        return  # all written, or the store is gone: nothing more will be
                elif not self.up:
                    self._probe()
            except Exception as e:  # a bug must neither end the thread nor strand a claim
                log.exception("dedupe store client error")
                self._failed(e)
                self._answer(claims, None)

    def _take(self) -> tuple[list[_Claim], list[_Settle], list[_Renew], bool]:
        with self._ready:
            if self.up:
                if not (self._claims or self._settles or self._renews or self._closing):
                    self._ready.wait(_IDLE_WAKE)
            else:
                # Down: settlements wait for the store, and a ping per interval, not
                # per settlement, looks for it (a busy engine queues thousands).
                self._ready.wait_for(lambda: self._closing or bool(self._claims), PROBE_INTERVAL)
            claims = list(self._claims)
            self._claims.clear()
            settles: list[_Settle] = []
            while self.up and self._settles and len(settles) < MAX_SETTLES_PER_CALL:
                settles.append(self._settles.popleft())
            # While down a renewal is dropped: the next one, or the one the store's
            # return asks for, carries every claim still live.
            renews, self._renews = self._renews, []
            return claims, settles, renews if self.up else [], self._closing

    def _pending(self) -> bool:
        with self._ready:
            return bool(self._claims or self._settles)

    def _call(self, claims: list[_Claim], settles: list[_Settle], renews: list[_Renew]) -> None:
        if not self.up:
            self._answer(claims, None)
            return
        try:
            try:
                results = self._send(claims, settles, renews)
            except redis.exceptions.NoScriptError:
                # A store restarted (or flushed its scripts): load them, once, and again.
                for script in self._shas:
                    self._client.script_load(script)
                results = self._send(claims, settles, renews)
        except (redis.RedisError, OSError) as e:
            self._failed(e)
            self._answer(claims, None)
            with self._ready:
                self._settles.extendleft(reversed(settles))  # again, once it answers
            return
        self._set_up(True)
        if claims:
            answers: list[tuple[Future[int | bytes | None], int | bytes | None]] = [
                (c.future, found) for c, found in zip(claims, results, strict=True)
            ]
            self._loop.call_soon_threadsafe(_resolve_all, answers)
            # Settled already: nothing of ours to keep alive (no settle follows).
            done = [
                (c.key, c.owner)
                for c, found in zip(claims, results, strict=True)
                if found == SETTLED
            ]
            if done:
                self._loop.call_soon_threadsafe(self._forget, done)

    def _send(
        self, claims: list[_Claim], settles: list[_Settle], renews: list[_Renew]
    ) -> list[int | bytes]:
        """The claims' answers. Renewals go first: a claim settled since its renewal
        was made is then settled after it, never written again over its release.
        Settlements go before claims: a retry in this process then finds its own
        earlier attempt released, not still holding the key. A verdict is written
        before the settlements: a claim released with one is never free without it."""
        pipe = self._client.pipeline(transaction=False)
        skip = self._calls(pipe, _RENEW, [(r.key, (r.owner, r.ttl_ms)) for r in renews])
        for s in settles:
            if s.verdict is not None:
                pipe.set(s.verdict[0], s.verdict[1], px=s.window_ms)
                skip += 1
        skip += self._calls(
            pipe, _SETTLE, [(s.key, (s.owner, int(s.settled), s.window_ms)) for s in settles]
        )
        claimed = self._calls(pipe, _CLAIM, [(c.key, (c.owner, c.ttl_ms)) for c in claims])
        # Redeliveries' claims also read what an attempt left for them (rare: only
        # a redelivery asks, and only when this replica remembers nothing).
        reading = [(i, c.verdict_key) for i, c in enumerate(claims) if c.verdict_key is not None]
        for _index, verdict_key in reading:
            pipe.get(verdict_key)
        results: list[Any] = pipe.execute()
        found: list[int | bytes] = [
            int(answer) for answers in results[skip : skip + claimed] for answer in answers
        ]
        for (index, _key), verdict in zip(reading, results[skip + claimed :], strict=True):
            if verdict is not None and found[index] == CLAIMED:
                found[index] = bytes(verdict)
        return found

    def _calls(self, pipe: Any, script: str, keyed: list[tuple[str, tuple[object, ...]]]) -> int:
        """``script`` on ``pipe`` for every (key, its arguments), ``CHUNK`` keys a
        call; how many calls."""
        for start in range(0, len(keyed), CHUNK):
            part = keyed[start : start + CHUNK]
            args = [value for _key, values in part for value in values]
            pipe.evalsha(self._shas[script], len(part), *(key for key, _ in part), *args)
        return -(-len(keyed) // CHUNK)

    def _answer(self, claims: list[_Claim], value: int | None) -> None:
        if claims:
            answers: list[tuple[Future[int | bytes | None], int | bytes | None]] = [
                (c.future, value) for c in claims
            ]
            self._loop.call_soon_threadsafe(_resolve_all, answers)

    def _probe(self) -> None:
        """A claim on a key of its own, not a PING: a store out of memory or read-only
        answers PING and refuses the writes that matter. At most once per interval."""
        if time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + PROBE_INTERVAL
        try:
            self._try_probe()
        except (redis.RedisError, OSError):
            return
        self._set_up(True)

    def _try_probe(self) -> None:
        """What a batch of claims needs of the store, tried once; raises what fails."""
        args = [value for _key in PROBE_KEYS for value in (self._probe_owner, 1000)]
        try:
            self._client.evalsha(self._shas[_CLAIM], len(PROBE_KEYS), *PROBE_KEYS, *args)
        except redis.exceptions.NoScriptError:
            self._client.script_load(_CLAIM)  # a store restarted, or its scripts flushed
            self._client.evalsha(self._shas[_CLAIM], len(PROBE_KEYS), *PROBE_KEYS, *args)

    def _failed(self, error: Exception) -> None:
        self._metrics.dedupe_store_errors.inc()
        if self.up:
            log.warning(
                "dedupe store unavailable; using this process's memory",
                store=redact_url(self._url),
                error=f"{type(error).__name__}: {error}",
            )
        self._set_up(False)
        self._next_probe = time.monotonic() + PROBE_INTERVAL

    def _set_up(self, up: bool) -> None:
        if up and not self.up:
            with self._ready:
                pending = len(self._settles)
            # Written next, before any new claim: said here, since a lost one is a duplicate.
            log.info(
                "dedupe store available again",
                store=redact_url(self._url),
                pending_settlements=pending,
            )
            self._dropping = False
            self._loop.call_soon_threadsafe(self._renew_now, None)
        self.up = up
        self._up_gauge.set(1 if up else 0)


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # how Redis names a script


def _resolve_all(answers: list[tuple[Future[int | bytes | None], int | bytes | None]]) -> None:
    """On the loop: one wake-up for a whole batch's answers, not one each."""
    for future, answer in answers:
        future.resolve(answer)
