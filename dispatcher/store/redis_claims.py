"""The shared dedupe store's client: claims and settlements in Redis, on the engine's loop.

The engine's claims and settlements are queued, and the first of a batch
schedules one hand-over, which runs after every callback already ready (all
the deliveries one read from the broker started): everything queued goes to
Redis as ``EVALSHA`` calls (at most ``CHUNK`` keys each) in one write, on a
connection the loop drives (``redis_link``), and the replies are read when
they arrive, by the loop, which resolves the claims' futures itself. Batches
follow one another without waiting for the replies of the last: Redis answers
in order. So the store costs a few microseconds per delivery and no thread.
A settlement is not awaited: alone, it waits up to ``SETTLE_WITHIN`` for a
claim's write to ride with (at a steady low rate, each event's settlement goes
with the next event's claim: one write and one reply an event, not two).

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

Failures never stop delivery. Every batch is answered within ``CALL_TIMEOUT``
or the connection counts as failed (no retries); a failure resolves the claims
in flight with ``None`` (the caller falls back to in-process memory), counts
``dispatcher_dedupe_store_errors_total``, sets ``dispatcher_dedupe_store_up``
to 0, logs once and closes the connection. Connecting happens on a short-lived
thread (``redis-connect``: a name lookup may block), once at start and every
``PROBE_INTERVAL`` while the store is down; what no socket timeout bounds (a
host name that takes forever to resolve) the loop does: claims waiting for a
connection are answered ``None`` after ``ANSWER_BOUND``. While the store is
down no claim waits for it: they are answered ``None`` at once. A connection
is a probe: its scripts loaded and one claim written across two hash slots.
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import hiredis
import redis

from dispatcher.config import redact_url
from dispatcher.delivery.dedupe import CLAIMED, SETTLED
from dispatcher.loop import Future, Loop, Timer
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import Metrics
from dispatcher.store.redis_link import RedisLink, Reply, open_connection

log = get_logger()

CALL_TIMEOUT: Final = 0.5  # connect, and a batch's answer once written
ANSWER_BOUND: Final = 4 * CALL_TIMEOUT  # a claim's wait for a connection
PROBE_INTERVAL: Final = 1.0  # while down: how often to try again
MAX_PENDING: Final = 100_000  # settlements kept across an outage
SETTLE_WITHIN: Final = 0.005  # how long a settlement waits for a claim to ride with
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


# What waits to be sent, as plain tuples: one is made for every claim and every
# settlement, and a dataclass's __init__ is a Python call, a microsecond of the
# few the store may cost an event.
# A claim: (key, owner, TTL ms, its answer, the key of the verdict to read with it
# (a redelivery's) or None).
_Claim = tuple[str, str, int, Future[int | bytes | None], str | None]
# A settlement: (key, owner, settled, window ms, the verdict left for the window as
# (its key, its bytes) or None).
_Settle = tuple[str, str, bool, int, tuple[str, bytes] | None]
_Renew = tuple[str, str, int]  # (key, owner, TTL ms)


@dataclass(slots=True)
class _Batch:
    """Commands sent together, and where the claims' answers are among their replies."""

    claims: list[_Claim]
    settles: list[_Settle]
    replies: int
    first_claim: int  # the index of the first claim script's reply
    claim_calls: int
    deadline: float
    got: list[Reply] = field(default_factory=list)


class RedisClaims:
    """One per service: the store's connection on the loop, and its health."""

    def __init__(self, url: str, loop: Loop, metrics: Metrics) -> None:
        self._url = url
        self._loop = loop
        self._metrics = metrics
        self._up_gauge = metrics.enable_dedupe_store()
        self._shas = {_CLAIM: _sha1(_CLAIM), _SETTLE: _sha1(_SETTLE), _RENEW: _sha1(_RENEW)}
        self._link: RedisLink | None = None
        self._connecting = False
        self._sent: deque[_Batch] = deque()  # written, replies awaited, oldest first
        self._deadline: Timer | None = None
        # Not sent yet: what the loop produced since the last hand-over (which the
        # first of them schedules: it runs after every callback already ready),
        # and settlements kept while the store is down.
        self._claims: list[_Claim] = []
        self._settles: deque[_Settle] = deque()
        self._renews: list[_Renew] = []  # the latest renewal, not sent yet
        self._scheduled = False
        self._settle_timer: Timer | None = None  # settlements alone: written by then
        # Every claim asked for and not settled, by key: (owner, TTL ms).
        self._live: dict[str, tuple[str, int]] = {}
        self._ms: dict[float, int] = {}  # seconds -> milliseconds, as Redis takes them
        self._renewal: Timer | None = None
        self._dropping = False  # settlements past MAX_PENDING dropped since the store went
        self._probe_owner = f"probe:{secrets.token_hex(4)}"
        self._closing = False
        self._written: Future[None] | None = None  # close's: nothing left to write
        # True until a call fails (and from the start, until the first connection
        # does): claims are sent, or wait for the connection, bounded.
        self.up = True
        self._up_gauge.set(1)

    # ----------------------------------------------------------------- the loop thread

    def claim(
        self, key: str, owner: str, ttl: float, verdict_key: str | None = None
    ) -> Future[int | bytes | None]:
        """1: claimed for ``owner``; 2: settled; 0: another owner holds it; None:
        the store did not answer (resolved at once while it is known to be down).
        With ``verdict_key``: claimed, and the verdict found there (bytes)."""
        future: Future[int | bytes | None] = Future(self._loop)
        ttl_ms = self._ms.get(ttl) or self._to_ms(ttl)
        self._live[key] = (owner, ttl_ms)  # renewed until settled, answered or not
        if self._renewal is None:
            self._renewal = self._loop.call_later(ttl / 3, self._renew)
        if not self.up or self._closing:
            future.resolve(None)
            return future
        self._claims.append((key, owner, ttl_ms, future, verdict_key))
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
        window_ms = self._ms.get(window) or self._to_ms(window)
        self._settles.append((key, owner, settled, window_ms, verdict))
        if not self._scheduled and self._settle_timer is None:
            # It rides with the next claim's write if one comes soon: at a steady
            # low rate a write and a reply of their own for each settlement cost
            # more CPU than the claim's. Nothing waits for it meanwhile: a
            # redelivery elsewhere finds the claim and polls.
            self._settle_timer = self._loop.call_later(SETTLE_WITHIN, self._hand_over)

    def _to_ms(self, seconds: float) -> int:
        """Milliseconds for Redis, remembered: a binding has a TTL and a window."""
        ms = self._ms[seconds] = max(1, round(seconds * 1000))
        return ms

    def _renew(self) -> None:
        """Every third of the shortest live TTL while claims live: every live claim
        written again (the latest renewal replaces one not sent yet)."""
        self._renewal = None
        if not self._live:
            return
        self._renews = [(key, owner, ttl) for key, (owner, ttl) in self._live.items()]
        self._schedule()
        shortest = min(ttl for _owner, ttl in self._live.values())
        self._renewal = self._loop.call_later(max(0.1, shortest / 3000), self._renew)

    def _renew_now(self) -> None:
        """The store answers again: what was claimed meanwhile is written now."""
        if self._renewal is not None:
            self._renewal.cancel()
        self._renew()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """Everything queued, to the store as one write (or to wait for it)."""
        self._scheduled = False
        if self._settle_timer is not None:
            self._settle_timer.cancel()
            self._settle_timer = None
        if self._link is not None:
            while self._link is not None and (self._claims or self._settles or self._renews):
                self._send()
        else:
            if self._claims and self.up:
                # Waiting for the first connection: bounded by the loop, whatever
                # holds the connection up (a name that never resolves).
                waiting = list(self._claims)
                self._loop.call_later(ANSWER_BOUND, self._unanswered, waiting)
            self._keep_pending()
        self._check_written()

    def _keep_pending(self) -> None:
        over = len(self._settles) - MAX_PENDING
        for _ in range(over):
            self._settles.popleft()  # oldest first: its claim is the nearest to expiring
        if over > 0 and not self._dropping:
            # Their events, redelivered to another replica, will not be found settled.
            self._dropping = True  # said once an outage (the store's return says it again)
            log.warning("dedupe store down too long: oldest settlements dropped", kept=MAX_PENDING)

    def _send(self) -> None:
        """One batch written. Renewals go first: a claim settled since its renewal was
        made is then settled after it, never written again over its release.
        Settlements go before claims: a retry in this process then finds its own
        earlier attempt released, not still holding the key. A verdict is written
        before the settlements: a claim released with one is never free without it."""
        assert self._link is not None
        claims, self._claims = self._claims, []
        taken = min(len(self._settles), MAX_SETTLES_PER_CALL)
        settles = [self._settles.popleft() for _ in range(taken)]
        renews, self._renews = self._renews, []
        commands: list[tuple[Any, ...]] = []
        if renews:
            args = [value for _key, owner, ttl_ms in renews for value in (owner, ttl_ms)]
            self._calls(commands, _RENEW, [key for key, *_rest in renews], args, 2)
        if settles:
            for _key, _owner, _settled, window_ms, verdict in settles:
                if verdict is not None:
                    commands.append(("SET", verdict[0], verdict[1], "PX", window_ms))
            args = [
                value
                for _key, owner, settled, window_ms, _verdict in settles
                for value in (owner, 1 if settled else 0, window_ms)
            ]
            self._calls(commands, _SETTLE, [s[0] for s in settles], args, 3)
        first_claim = len(commands)
        if claims:
            args = [value for _key, owner, ttl, _future, _read in claims for value in (owner, ttl)]
            self._calls(commands, _CLAIM, [c[0] for c in claims], args, 2)
        claim_calls = len(commands) - first_claim
        # Redeliveries' claims also read what an attempt left for them (rare: only
        # a redelivery asks, and only when this replica remembers nothing).
        commands += [("GET", c[4]) for c in claims if c[4] is not None]
        deadline = self._loop.time() + CALL_TIMEOUT
        batch = _Batch(claims, settles, len(commands), first_claim, claim_calls, deadline)
        self._sent.append(batch)
        if self._deadline is None:
            self._deadline = self._loop.call_later(CALL_TIMEOUT, self._check_deadline)
        self._link.send(commands)

    def _calls(
        self,
        commands: list[tuple[Any, ...]],
        script: str,
        keys: list[str],
        args: list[Any],
        per_key: int,
    ) -> None:
        """``script`` over ``keys`` and their arguments (``per_key`` each), ``CHUNK``
        keys a call."""
        sha = self._shas[script]
        for start in range(0, len(keys), CHUNK):
            part = keys[start : start + CHUNK]
            mine = args[start * per_key : (start + len(part)) * per_key]
            commands.append(("EVALSHA", sha, len(part), *part, *mine))

    def _on_reply(self, reply: Reply) -> None:
        try:
            self._take_reply(reply)
        except Exception as e:  # a bug must not strand a claim: memory decides them
            log.exception("dedupe store client error")
            self._failed(e)

    def _take_reply(self, reply: Reply) -> None:
        batch = self._sent[0]
        batch.got.append(reply)
        if len(batch.got) < batch.replies:
            return
        self._sent.popleft()
        error = next((r for r in batch.got if isinstance(r, hiredis.ReplyError)), None)
        if error is not None:
            # Refused, not lost: NOSCRIPT (scripts flushed), OOM, READONLY, CROSSSLOT.
            self._sent.appendleft(batch)  # failed with the rest
            self._failed(error)
            return
        self._answered(batch)
        self._check_written()

    def _answered(self, batch: _Batch) -> None:
        claims = batch.claims
        if not claims:
            return
        answers = batch.got[batch.first_claim : batch.first_claim + batch.claim_calls]
        found: list[int | bytes] = [answer for part in answers for answer in part]
        if len(batch.got) > batch.first_claim + batch.claim_calls:
            verdicts = iter(batch.got[batch.first_claim + batch.claim_calls :])
            for index, claim in enumerate(claims):
                if claim[4] is not None:
                    verdict = next(verdicts)
                    if verdict is not None and found[index] == CLAIMED:
                        found[index] = bytes(verdict)
        live = self._live
        for (key, owner, _ttl_ms, future, _read), answer in zip(claims, found, strict=True):
            if answer == SETTLED and live.get(key, ("",))[0] == owner:
                del live[key]  # nothing of ours to keep alive: no settle follows
            future.resolve(answer)

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self._sent:
            return
        late = self._sent[0].deadline - self._loop.time()
        if late <= 0:
            self._failed(TimeoutError(f"no answer within {CALL_TIMEOUT}s"))
        else:
            self._deadline = self._loop.call_later(late, self._check_deadline)

    def _unanswered(self, claims: list[_Claim]) -> None:
        """Claims that waited ``ANSWER_BOUND`` for a connection: memory decides them,
        and the store counts as down until a probe finds it."""
        if self._link is None and self.up and any(not claim[3].done() for claim in claims):
            self._failed(TimeoutError(f"no connection within {ANSWER_BOUND}s"))

    # ----------------------------------------------------------------- health

    def _disconnect(self) -> deque[_Batch]:
        """Close the connection (if any); every claim not answered yet gets None
        (memory decides it). What was in flight, for its settlements."""
        if self._link is not None:
            link, self._link = self._link, None
            link.close()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        sent, self._sent = self._sent, deque()
        waiting, self._claims = self._claims, []
        for claim in [c for batch in sent for c in batch.claims] + waiting:
            claim[3].resolve(None)
        return sent

    def _failed(self, error: Exception) -> None:
        """A call failed, or the connection: claims in flight get None (memory
        decides), their settlements are written once the store answers again."""
        for batch in reversed(self._disconnect()):
            self._settles.extendleft(reversed(batch.settles))
        self._renews = []  # the store's return renews every live claim
        self._metrics.dedupe_store_errors.inc()
        if self.up:
            log.warning(
                "dedupe store unavailable; using this process's memory",
                store=redact_url(self._url),
                error=f"{type(error).__name__}: {error}",
            )
        self._set_up(False)
        self._keep_pending()
        self._check_written()
        if not self._closing:
            self._loop.call_later(PROBE_INTERVAL, self._connect)

    def _lost(self, error: Exception) -> None:
        self._link = None  # it closed itself
        self._failed(error)

    def _connect(self) -> None:
        """Open a connection off the loop (the probe: a claim over two hash slots,
        as a batch's are; not a PING, which a store out of memory or read-only
        answers while it refuses the writes that matter)."""
        if self._connecting or self._link is not None or self._closing:
            return
        self._connecting = True
        threading.Thread(target=self._open, name="redis-connect", daemon=True).start()

    def _open(self) -> None:
        """On the connector thread: a connection, its scripts loaded, probed."""
        try:
            connection = open_connection(self._url, CALL_TIMEOUT)
        except (redis.RedisError, OSError) as e:
            self._loop.call_soon_threadsafe(self._not_opened, e)
            return
        try:
            for script in self._shas:
                connection.send_command("SCRIPT", "LOAD", script)
                connection.read_response()
            args = [value for _key in PROBE_KEYS for value in (self._probe_owner, 1000)]
            probe = (self._shas[_CLAIM], len(PROBE_KEYS), *PROBE_KEYS, *args)
            connection.send_command("EVALSHA", *probe)
            connection.read_response()
        except (redis.RedisError, OSError) as e:
            connection.disconnect()
            self._loop.call_soon_threadsafe(self._not_opened, e)
            return
        if not self._loop.call_soon_threadsafe(self._opened, connection):
            connection.disconnect()  # the loop is gone

    def _opened(self, connection: Any) -> None:
        self._connecting = False
        if self._closing:
            connection.disconnect()
            return
        try:
            self._link = RedisLink(self._loop, connection, self._on_reply, self._lost)
        except OSError as e:
            connection.disconnect()
            self._not_opened(e)
            return
        self._set_up(True)
        self._renew_now()
        self._hand_over()

    def _not_opened(self, error: Exception) -> None:
        self._connecting = False
        if self.up:
            self._failed(error)  # says it once, and probes again
        elif not self._closing:
            self._loop.call_later(PROBE_INTERVAL, self._connect)

    def _set_up(self, up: bool) -> None:
        if up and not self.up:
            # Written next, before any new claim: said here, since a lost one is a duplicate.
            log.info(
                "dedupe store available again",
                store=redact_url(self._url),
                pending_settlements=len(self._settles),
            )
            self._dropping = False
        self.up = up
        self._up_gauge.set(1 if up else 0)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Connect now, not at the first delivery: the gauge tells the truth at once."""
        self._connect()

    def close(self, timeout: float) -> None:
        """Write what is queued (bounded by ``timeout``), then close. Claims still
        unanswered get ``None``: every claim's future is resolved. From any thread;
        with the loop not running (and not closed), it runs the loop here to write."""
        thread = self._loop.thread
        if thread is not None and thread.is_alive() and not self._loop.on_loop_thread():
            done = threading.Event()
            if self._loop.call_soon_threadsafe(self._close_within, (timeout, done.set)):
                done.wait(timeout + CALL_TIMEOUT)
            return
        finished: Future[None] = self._loop.create_future()
        self._close_within((timeout, lambda: finished.resolve(None)))

        async def written() -> None:
            await finished

        self._loop.run_until_complete(written())

    def _close_within(self, args: tuple[float, Callable[[], object]]) -> None:
        timeout, then = args
        self._closing = True
        if self._renewal is not None:
            self._renewal.cancel()
        written: Future[None] = self._loop.create_future()
        bound = self._loop.call_later(timeout, written.resolve, None)

        def shut(_none: None) -> None:
            bound.cancel()
            self._shut()
            then()

        written.on_done(shut)
        self._written = written
        self._hand_over()

    def _check_written(self) -> None:
        """At close: resolve ``_written`` once nothing is left to write (or the store
        is gone: nothing more will be)."""
        if self._written is not None and (
            self._link is None or not (self._sent or self._settles or self._claims)
        ):
            self._written.resolve(None)

    def _shut(self) -> None:
        if self._settle_timer is not None:
            self._settle_timer.cancel()
        self._disconnect()


def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()  # how Redis names a script
