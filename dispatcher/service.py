"""Wires settings into a running service: supervisor, pools, handlers, publisher.

Shutdown order (PRODUCT.md, "Operations"): readiness off and consumers
cancelled; in-flight work gets ``shutdown.grace`` to finish and be acked;
then waits are cut short, whatever is still unsettled is left unacked for the
broker to redeliver, and the connection is closed. Every step is bounded.
"""

from __future__ import annotations

import gc
import ssl
import threading
import time
from functools import partial

from dispatcher.broker import Supervisor
from dispatcher.broker_params import virtual_host
from dispatcher.config import BindingSettings, Settings
from dispatcher.deadletter import DeadLetterer
from dispatcher.dedupe import DedupeStore
from dispatcher.delivery import HttpTarget, ThreadClients
from dispatcher.errors import ConfigError
from dispatcher.handler import Action, Delivery, Handler
from dispatcher.logs import get_logger
from dispatcher.metrics import BindingMetrics, Metrics
from dispatcher.pool import WorkerPool
from dispatcher.publisher import Publisher
from dispatcher.reply import Replier
from dispatcher.server import OpsServer

log = get_logger()

# After grace, closing the consuming connection and the publisher each get
# this long at most, so `run` returns within grace + 2 * CLOSE_BOUND.
CLOSE_BOUND = 3.0


class Service:
    """Everything that can fail on bad settings is built before anything that holds a
    socket or a thread, so a ``ConfigError`` from the constructor leaves nothing behind."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = Metrics([b.delivery.timeout for b in settings.bindings])
        # Set once grace is over: retry and requeue waits end, leaving messages unacked.
        self._give_up = threading.Event()
        self._stop_requested = threading.Event()
        try:
            self.supervisor = Supervisor(settings.broker, self.metrics)
            self.publisher = (
                Publisher(
                    settings.broker, on_blocked=partial(self.metrics.set_blocked, "publisher")
                )
                if _needs_publisher(settings)
                else None
            )
        except (OSError, ssl.SSLError, ValueError) as e:
            raise ConfigError("broker.tls", f"cannot load: {e}") from e
        self._clients = [_clients(index, b) for index, b in enumerate(settings.bindings)]
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
        self._pools: list[WorkerPool[Delivery]] = []
        vhost = virtual_host(settings.broker)
        for binding, clients in zip(settings.bindings, self._clients, strict=True):
            self._add_binding(binding, clients, vhost)

    def _add_binding(self, binding: BindingSettings, client: ThreadClients, vhost: str) -> None:
        self.metrics.delivery_timeout.labels(binding.name).set(binding.delivery.timeout)
        metrics = self.metrics.binding(binding.name)
        publish_timeout = binding.delivery.timeout
        subscriber = HttpTarget(
            client,
            binding.subscriber,
            binding.delivery,
            self._give_up,
            observe=metrics.observe_attempt,
            max_response_bytes=binding.max_body_size,
        )
        sink = (
            HttpTarget(client, binding.dead_letter.sink, binding.delivery, self._give_up)
            if binding.dead_letter.sink
            else None
        )
        reply_target = (
            HttpTarget(client, binding.reply.url, binding.delivery, self._give_up)
            if binding.reply.url
            else None
        )
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
            ),
            Replier(
                binding.reply, binding.content_mode, reply_target, self.publisher, publish_timeout
            ),
            DedupeStore(binding.dedupe_window),
            metrics,
            self._give_up,
        )
        pool: WorkerPool[Delivery] = WorkerPool(
            f"worker-{binding.name}",
            binding.workers,
            partial(self._work, binding.name, metrics, handler),
        )
        self._pools.append(pool)
        self.supervisor.add_binding(binding, pool.submit)

    def _work(
        self, binding: str, metrics: BindingMetrics, handler: Handler, delivery: Delivery
    ) -> None:
        action = Action.LEAVE
        metrics.inflight.inc()
        try:
            action = handler.handle(delivery)
        except Exception:
            # A bug, not an input problem (those are dead-lettered with a reason).
            # Give the message back rather than hold its prefetch slot forever.
            log.exception("handler failed", binding=binding)
            action = Action.LEAVE if self._give_up.wait(1.0) else Action.REQUEUE
        finally:
            metrics.inflight.dec()
            self.supervisor.settle(binding, delivery, action)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        log.info("starting", bindings=[b.name for b in self.settings.bindings])
        # Everything built so far (modules, settings, clients) lives as long as
        # the process: take it out of the garbage collector's full passes, which
        # otherwise walk it all and stall every thread for tens of milliseconds.
        gc.collect()
        gc.freeze()
        self.ops.start()
        self.supervisor.start()

    def request_stop(self) -> None:
        """Signal-safe: only sets a flag."""
        self._stop_requested.set()

    def wait_for_stop(self) -> None:
        while not self._stop_requested.wait(1.0):
            pass

    def ready(self) -> bool:
        """What ``/readyz`` answers (one rule, not a copy of it)."""
        return self.ops.readyz()[0] == 200

    def shutdown(self) -> None:
        grace = self.settings.shutdown.grace
        log.info("shutdown started", grace_s=grace)
        deadline = time.monotonic() + grace
        self.supervisor.begin_shutdown()
        for pool in self._pools:
            pool.stop()
        idle = all(pool.wait_idle(max(0.0, deadline - time.monotonic())) for pool in self._pools)
        self._give_up.set()
        if not idle:
            log.warning("grace period over; unfinished messages stay unacked for redelivery")
        self.supervisor.finish(timeout=CLOSE_BOUND)
        if self.publisher is not None:
            self.publisher.close(timeout=CLOSE_BOUND)
        for client in self._clients:
            client.close()
        self.ops.close()
        gc.unfreeze()  # an embedding process (a test run) goes on collecting as before
        log.info("shutdown complete", clean=idle)


def _clients(index: int, binding: BindingSettings) -> ThreadClients:
    """The binding's HTTP clients; its TLS files are loaded now, a bad one is a config error."""
    try:
        return ThreadClients(binding.tls)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"bindings[{index}].tls", f"cannot load: {e}") from e


def _needs_publisher(settings: Settings) -> bool:
    return any(
        b.dead_letter.exchange is not None or b.reply.exchange is not None
        for b in settings.bindings
    )
