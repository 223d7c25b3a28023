"""Wires settings into a running service: supervisor, engine, handlers, publisher.

Threads: the engine loop's (both broker connections, every delivery, every
HTTP request), the shared dedupe store's client (with ``dedupe.store``), the
ops listener's, the signal taker, and the main thread waiting for a signal.
None of them is per delivery.

Shutdown order (``docs/design.md``, "Shutdown"): readiness off and consumers
cancelled; in-flight work gets ``shutdown.grace`` to finish and be acked;
then waits are cut short, whatever is still unfinished is left unacked for the
broker to redeliver, and the connection is closed. Every step is bounded.
"""

from __future__ import annotations

import contextlib
import gc
import os
import resource
import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from dispatcher.broker.params import virtual_host
from dispatcher.broker.publisher import Publisher
from dispatcher.broker.supervisor import Supervisor
from dispatcher.config import BindingSettings, DeliverySettings, Settings, advice, otel
from dispatcher.delivery.breaker import CircuitBreaker, reported
from dispatcher.delivery.deadletter import DeadLetterer
from dispatcher.delivery.dedupe import MemoryDedupe, SharedDedupe
from dispatcher.delivery.engine import Engine
from dispatcher.delivery.filters import compile_filter
from dispatcher.delivery.handler import Handler, longest_attempt
from dispatcher.delivery.rate_limit import RateLimit
from dispatcher.delivery.reply import Replier
from dispatcher.delivery.seams import Dedupe
from dispatcher.errors import ConfigError
from dispatcher.event import http
from dispatcher.http.client import HttpClient
from dispatcher.http.endpoint import Endpoint
from dispatcher.http.target import HttpTarget
from dispatcher.loop import WRITABLE
from dispatcher.observe import logs
from dispatcher.observe.logs import get_logger
from dispatcher.observe.metrics import Metrics
from dispatcher.observe.tracing import Tracer
from dispatcher.ops.server import OpsServer
from dispatcher.resolve import BindingEndpoints, Resolved, resolve

if TYPE_CHECKING:
    from dispatcher.store.redis_claims import RedisClaims

log = get_logger()

# After grace, closing the consuming connection and the publisher each get
# this long at most, so `run` returns within grace + 2 * CLOSE_BOUND.
CLOSE_BOUND = 3.0


class Service:
    """Built from the settings and what ``dispatcher.resolve`` read of them (resolved
    here when not given: tests and tools). Everything that can fail on bad settings
    was resolved before anything that holds a socket or a thread, so a
    ``ConfigError`` from the constructor leaves nothing behind."""

    def __init__(self, settings: Settings, resolved: Resolved | None = None) -> None:
        self.settings = settings
        self.metrics = Metrics([b.delivery.timeout for b in settings.bindings])
        self.metrics.count_log_drops(lambda: logs.OUTPUT.dropped)
        self._log_attached = False
        self._stop_requested = threading.Event()
        self._gc_threshold = gc.get_threshold()  # put back at shutdown
        endpoints = list((resolved or resolve(settings)).bindings)
        # Each delivery in flight may hold a connection to each of its binding's URLs.
        connections = sum(
            b.effective_parallelism * (1 + (e.sink is not None) + (e.reply is not None))
            for b, e in zip(settings.bindings, endpoints, strict=True)
        )
        self._sockets_needed = connections + _OWN_DESCRIPTORS
        self.engine = Engine()
        self.http = HttpClient(self.engine.loop, connections)
        self.engine.close_at_stop(self.http.close)
        try:
            self._build(settings, endpoints)
        except BaseException:
            self.engine.loop.close()  # never started: nothing else to undo
            raise

    def _build(self, settings: Settings, endpoints: list[BindingEndpoints]) -> None:
        self.supervisor = Supervisor(
            settings.broker, self.metrics, self.engine.loop, self.engine.waits
        )
        self.publisher = (
            Publisher(
                settings.broker,
                self.engine.loop,
                on_blocked=partial(self.metrics.set_blocked, "publisher"),
            )
            if _needs_publisher(settings)
            else None
        )
        self.claims: RedisClaims | None = None
        if settings.dedupe.store is not None:
            # Imported only when used: redis-py is 8 MB of memory a single replica
            # without a store has no use for.
            from dispatcher.store.redis_claims import RedisClaims

            self.claims = RedisClaims(settings.dedupe.store, self.engine.loop, self.metrics)
        try:
            self.ops = OpsServer(
                settings.http.host,
                settings.http.port,
                self.metrics.registry,
                last_tick=lambda: self.supervisor.last_tick,
                consumers=self.supervisor.consumers,
                stopping=self._stop_requested.is_set,
            )
        except OSError as e:
            raise ConfigError("http.listen", f"cannot listen on {settings.http.listen}: {e}") from e
        self.tracer = self._tracer(settings)
        vhost = virtual_host(settings.broker)
        # Read by tests and debugging; each is the loop's to change.
        self.breakers: dict[str, CircuitBreaker] = {}
        self.handlers: dict[str, Handler] = {}
        for binding, urls in zip(settings.bindings, endpoints, strict=True):
            self._add_binding(binding, urls, vhost)

    def _add_binding(self, binding: BindingSettings, urls: BindingEndpoints, vhost: str) -> None:
        self.metrics.delivery_timeout.labels(binding.name).set(binding.delivery.timeout)
        metrics = self.metrics.binding(binding.name)
        publish_timeout = binding.delivery.timeout
        engine = self.engine

        def target(
            url: Endpoint | None,
            delivery: DeliverySettings = binding.delivery,
            own_headers: tuple[tuple[str, str], ...] = (),
            **options: object,
        ) -> HttpTarget | None:
            if url is None:
                return None
            return HttpTarget(
                self.http,
                url,
                delivery,
                engine.waits,
                max_response_bytes=binding.max_body_size,
                extra_headers=own_headers + binding.headers,
                bearer=urls.bearer,
                **options,  # type: ignore[arg-type]
            )

        # One request to the reply URL per delivery attempt: a refused reply fails
        # the attempt, and the attempts are the subscriber's (reply.py).
        single = binding.delivery.model_copy(update={"retry": 0})
        replier = Replier(
            binding.reply,
            binding.content_mode,
            target(urls.reply, single),
            self.publisher,
            publish_timeout,
        )
        breaker = self._breaker(binding)
        rate = binding.delivery.rate_limit
        limit = None if rate is None else RateLimit(rate, engine.waits, metrics.rate_limited.inc)
        # Answers are read whole exactly when the handler will look for a reply
        # in them: one decision, the replier's. The breaker and the rate limit
        # protect the subscriber: the dead-letter sink and reply URL are not it.
        subscriber = target(
            urls.subscriber,
            own_headers=http.SUBSCRIBER_HEADERS,
            observe=metrics.observe_attempt,
            read_reply=replier.enabled,
            breaker=breaker,
            rate_limit=limit,
        )
        assert subscriber is not None
        sink = target(urls.sink)
        handler = Handler(
            binding,
            vhost,
            subscriber,
            DeadLetterer(
                binding.dead_letter,
                binding.subscriber,
                binding.content_mode,
                sink,
                self.publisher,
                publish_timeout,
                binding.name,
            ),
            replier,
            self._dedupe(binding, longest_attempt(binding, subscriber)),
            metrics,
            engine.waits,
            engine.lines,
            compile_filter(binding),
            self.tracer,
        )
        self.handlers[binding.name] = handler
        self.supervisor.add_binding(binding, handler.handle, breaker)

    def _breaker(self, binding: BindingSettings) -> CircuitBreaker | None:
        settings = binding.circuit_breaker
        if settings is None:
            return None
        metrics = self.metrics.register_breaker(binding.name, settings.max_open)
        breaker = CircuitBreaker(settings, self.engine.loop, reported(binding.name, metrics))
        metrics.open_seconds.set_function(breaker.open_seconds)
        self.engine.close_at_stop(breaker.close)
        self.breakers[binding.name] = breaker
        return breaker

    def _tracer(self, settings: Settings) -> Tracer | None:
        if not settings.tracing.enabled:
            return None  # and OpenTelemetry is never imported
        from dispatcher.observe.otlp import OtlpTracer

        url = otel.traces_url(settings.tracing, os.environ)
        return OtlpTracer(settings.tracing, url, self.metrics.spans_dropped.inc)

    def _dedupe(self, binding: BindingSettings, claim_ttl: float) -> Dedupe:
        local = MemoryDedupe(binding.dedupe_window, self.engine.waits)
        if self.claims is None:
            return local
        waits = self.engine.waits
        return SharedDedupe(
            binding.name, binding.dedupe_window, claim_ttl, waits, self.claims, local
        )

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        log.info("starting", bindings=[b.name for b in self.settings.bindings])
        for said in advice(self.settings, os.environ):
            log.warning(said.text, key=said.key)
        # Everything built so far (modules, settings, clients) lives as long as
        # the process: take it out of the garbage collector's full passes, which
        # otherwise walk it all and stall every thread for tens of milliseconds.
        gc.collect()
        gc.freeze()
        # Young-generation passes walk every delivery in flight (coroutines,
        # futures); every 10,000 allocations instead of 700 is 3% fewer
        # instructions per delivery for about a megabyte of garbage at most.
        gc.set_threshold(10_000, 50, 50)
        _allow_open_files(self._sockets_needed)
        self.ops.start()
        self._log_attached = logs.OUTPUT.attach(self.engine.loop, WRITABLE)
        self.engine.start()
        if self.claims is not None:
            self.claims.start()
        if self.publisher is not None:
            self.publisher.start()
        self.supervisor.start()

    def request_stop(self) -> None:
        """Readiness goes 503 ("shutting down") at once; ``shutdown`` does the rest."""
        self._stop_requested.set()

    def ready(self) -> bool:
        """What ``/readyz`` answers (one rule, not a copy of it)."""
        return self.ops.readyz()[0] == 200

    def shutdown(self) -> None:
        grace = self.settings.shutdown.grace
        log.info("shutdown started", grace_s=grace)
        deadline = time.monotonic() + grace
        self.supervisor.begin_shutdown()
        idle = self.supervisor.wait_idle(max(0.0, deadline - time.monotonic()))
        self.engine.give_up()
        if not idle:
            log.warning("grace period over; unfinished messages stay unacked for redelivery")
            # Deliveries whose waits just ended end as LEAVE; let them (bounded,
            # and only for accounting) before the connection closes.
            self.supervisor.wait_idle(CLOSE_BOUND / 3)
        self.supervisor.finish(timeout=CLOSE_BOUND)
        if self.publisher is not None:
            self.publisher.close(timeout=CLOSE_BOUND)
        if self.claims is not None:
            # The last settlements, bounded; on the loop, which drives the store's
            # connection, so before it stops.
            self.claims.close(timeout=CLOSE_BOUND)
        self.engine.stop(timeout=CLOSE_BOUND)
        if self._log_attached:
            logs.OUTPUT.detach()  # the loop has stopped: the last lines, bounded
        if self.tracer is not None:
            self.tracer.shutdown(timeout=CLOSE_BOUND)  # the last spans, bounded
        self.ops.close()
        gc.unfreeze()  # an embedding process (a test run) goes on collecting as before
        gc.set_threshold(*self._gc_threshold)
        log.info("shutdown complete", clean=idle)


# Broker connections, the ops listener, logs, pipes, the loop's poller: with room.
_OWN_DESCRIPTORS = 64


def _allow_open_files(needed: int) -> None:
    """Raise the soft limit on open files to the hard one (as Go's runtime does for
    every program): thousands of deliveries in flight each hold a socket, and the
    usual soft default of 1,024 would turn into failed attempts. Say so if even
    the hard limit is below what the configured parallelism may need."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open-file limit below what parallelism may need; raise it (ulimit -n)",
            limit=soft,
            needed=needed,
        )


def _needs_publisher(settings: Settings) -> bool:
    return any(
        b.dead_letter.exchange is not None or b.reply.exchange is not None
        for b in settings.bindings
    )
