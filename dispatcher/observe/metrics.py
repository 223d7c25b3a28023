"""Every Prometheus metric the service serves, with low-cardinality labels.

Their names and labels are part of the user contract
(docs/operations.md's metrics list, dashboards and the alert rules in
``deploy/prometheus``): never rename one.

Labels are low-cardinality by construction: a binding name (validated at
load), an outcome, a status class, a reconnect reason. Never an event id or URL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from dispatcher.observe.outcomes import LOGGED_OUTCOMES

# `_created` series double the scrape size and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


RECONNECT_REASONS = (
    "connection_lost",
    "closed_by_broker",
    "heartbeat_timeout",
    "blocked_timeout",
    "connect_failed",
    "channel_closed",
    "consumer_cancelled",
    "stream_queue",
    "error",
)
CODE_CLASSES = ("2xx", "3xx", "4xx", "5xx", "error")
CIRCUIT_STATES = ("closed", "open", "half_open")  # by dispatcher_circuit_state's value


def code_class(status: int | None) -> str:
    """No status (timeout, transport error) is ``error``; a status outside 100-599
    is ``5xx`` (as ``retry.classify`` counts it); otherwise the hundreds digit."""
    if status is None:
        return "error"
    if not 100 <= status <= 599:
        return "5xx"
    return _CLASSES[status // 100]


_CLASSES = ("error", "error", "2xx", "3xx", "4xx", "5xx")  # by the hundreds digit


def duration_buckets(timeouts: list[float]) -> tuple[float, ...]:
    """HTTP-dispatch buckets from 1 ms up, plus every configured per-attempt timeout."""
    base = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]
    # Attempts cut at a timeout last a hair longer than it: a finite bucket above
    # every timeout keeps "p99 above the timeout" computable (else it lands in +Inf).
    above = {2 * t for t in timeouts if t >= base[-1]}
    return tuple(sorted(set(base) | set(timeouts) | above))


class Metrics:
    """Every metric of the service, on a registry of its own (so tests can read values)."""

    def __init__(self, timeouts: list[float] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter(
            "dispatcher_events",
            "Final outcome of each message.",
            ["binding", "outcome"],
            registry=r,
        )
        self.attempts = Counter(
            "dispatcher_delivery_attempts",
            "HTTP delivery attempts by status class.",
            ["binding", "code_class"],
            registry=r,
        )
        self.dispatch_duration = Histogram(
            "dispatcher_dispatch_duration_seconds",
            "Duration of one HTTP delivery attempt.",
            ["binding"],
            buckets=duration_buckets(timeouts or [10.0]),
            registry=r,
        )
        self.inflight = Gauge(
            "dispatcher_inflight",
            "Deliveries in flight in the engine (read when scraped).",
            ["binding"],
            registry=r,
        )
        self.consumer_up = Gauge(
            "dispatcher_consumer_up",
            "1 while the binding has a live consumer.",
            ["binding"],
            registry=r,
        )
        self.broker_connected = Gauge(
            "dispatcher_broker_connected", "1 while the consuming connection is open.", registry=r
        )
        self.reconnects = Counter(
            "dispatcher_reconnects",
            "Connection or channel rebuilds, by reason.",
            ["reason"],
            registry=r,
        )
        for reason in RECONNECT_REASONS:  # zeros, so increase() sees the first one
            self.reconnects.labels(reason)
        self.stale_acks = Counter(
            "dispatcher_stale_acks",
            "Settlements dropped because their channel generation was gone.",
            ["binding"],
            registry=r,
        )
        self.duplicates_suppressed = Counter(
            "dispatcher_duplicates_suppressed",
            "Redeliveries settled without a second request.",
            ["binding"],
            registry=r,
        )
        self.delivery_timeout = Gauge(
            "dispatcher_delivery_timeout_seconds",
            "Configured per-attempt timeout (lets alerts compare latency with it).",
            ["binding"],
            registry=r,
        )
        self.broker_node = Gauge(
            "dispatcher_broker_node",
            "1 for the broker node (host:port) the consuming connection is open to.",
            ["node"],
            registry=r,
        )
        self.dedupe_store_errors = Counter(
            "dispatcher_dedupe_store_errors",
            "Calls to the shared dedupe store that failed or timed out.",
            registry=r,
        )
        self.spans_dropped = Counter(
            "dispatcher_spans_dropped",
            "Trace spans dropped: the collector was behind, down or refused them.",
            registry=r,
        )
        self.circuit_state = Gauge(
            "dispatcher_circuit_state",
            "Circuit breaker state: 0 closed, 1 open, 2 half-open (bindings with a breaker).",
            ["binding"],
            registry=r,
        )
        self.circuit_transitions = Counter(
            "dispatcher_circuit_transitions",
            "Circuit breaker transitions, by the state entered.",
            ["binding", "to"],
            registry=r,
        )
        self.circuit_open_seconds = Gauge(
            "dispatcher_circuit_open_seconds",
            "Seconds since the circuit breaker last left closed; 0 while closed.",
            ["binding"],
            registry=r,
        )
        self.circuit_max_open = Gauge(
            "dispatcher_circuit_max_open_seconds",
            "Configured circuit_breaker.max_open (lets alerts compare the open time with it).",
            ["binding"],
            registry=r,
        )
        self.rate_limited = Counter(
            "dispatcher_rate_limited_seconds",
            "Seconds requests to the subscriber waited for the binding's rate limit.",
            ["binding"],
            registry=r,
        )
        self.dedupe_store_up: Gauge | None = None  # registered only with a store
        self._nodes: set[str] = set()  # every node connected to so far (a cluster's few)
        self._blocked: set[str] = set()
        self._blocked_lock = threading.Lock()
        self.broker_blocked = Gauge(
            "dispatcher_broker_blocked", "1 while the broker has blocked a connection.", registry=r
        )

    def enable_dedupe_store(self) -> Gauge:
        """``dispatcher_dedupe_store_up``, which exists only when a store is configured."""
        if self.dedupe_store_up is None:
            self.dedupe_store_up = Gauge(
                "dispatcher_dedupe_store_up",
                "1 while the shared dedupe store answers.",
                registry=self.registry,
            )
        return self.dedupe_store_up

    def set_broker_node(self, node: str | None) -> None:
        """The node the consuming connection is open to; None: not connected."""
        with self._blocked_lock:
            for seen in self._nodes:
                self.broker_node.labels(seen).set(0)
            if node is not None:
                self._nodes.add(node)
                self.broker_node.labels(node).set(1)

    def set_blocked(self, connection: str, blocked: bool) -> None:
        """``dispatcher_broker_blocked`` is 1 while any of our connections is blocked."""
        with self._blocked_lock:
            if blocked:
                self._blocked.add(connection)
            else:
                self._blocked.discard(connection)
            self.broker_blocked.set(1 if self._blocked else 0)

    def count_log_drops(self, read: Callable[[], int]) -> None:
        """``dispatcher_log_lines_dropped_total``: log lines a stdout nobody read
        could not take (``log_output``); ``read`` is asked at each scrape."""
        self.registry.register(_ReadCounter("dispatcher_log_lines_dropped", _LOG_DROPS_HELP, read))

    def register_binding(self, binding: str) -> None:
        """Create every labelled child so dashboards see zeros, not gaps."""
        for outcome in LOGGED_OUTCOMES:
            self.events.labels(binding, outcome)
        for cls in CODE_CLASSES:
            self.attempts.labels(binding, cls)
        self.dispatch_duration.labels(binding)
        self.inflight.labels(binding)
        self.consumer_up.labels(binding)
        self.stale_acks.labels(binding)
        self.duplicates_suppressed.labels(binding)

    def register_breaker(self, binding: str, max_open: float) -> BreakerMetrics:
        """The breaker's series, only for a binding that has one: closed, no
        transition yet (its open time: ``BreakerMetrics.open_seconds``)."""
        state = self.circuit_state.labels(binding)
        state.set(0)
        self.circuit_max_open.labels(binding).set(max_open)
        transitions = {s: self.circuit_transitions.labels(binding, s) for s in CIRCUIT_STATES}
        return BreakerMetrics(state, transitions, self.circuit_open_seconds.labels(binding))

    def binding(self, binding: str) -> BindingMetrics:
        """The children of one binding, looked up once: ``labels()`` on every message
        cost about 6 us of a delivery's CPU."""
        return BindingMetrics(self, binding)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """Current value of one sample (tests and probes); 0.0 when absent."""
        found = self.registry.get_sample_value(name, labels or {})
        return 0.0 if found is None else found


@dataclass(frozen=True, slots=True)
class BreakerMetrics:
    """What a binding's breaker moves on a transition (``breaker.reported``)."""

    state: Gauge
    transitions: Mapping[str, Counter]
    # Given the breaker's ``open_seconds`` (``set_function``): read when scraped.
    open_seconds: Gauge


class BindingMetrics:
    """One binding's labelled metric children, for the per-message path."""

    def __init__(self, metrics: Metrics, binding: str) -> None:
        self.events = {o: metrics.events.labels(binding, o) for o in LOGGED_OUTCOMES}
        self.attempts = {c: metrics.attempts.labels(binding, c) for c in CODE_CLASSES}
        self.dispatch_duration = metrics.dispatch_duration.labels(binding)
        self.inflight = metrics.inflight.labels(binding)
        self.duplicates_suppressed = metrics.duplicates_suppressed.labels(binding)
        self.rate_limited = metrics.rate_limited.labels(binding)

    def observe_attempt(self, status: int | None, seconds: float) -> None:
        self.attempts[code_class(status)].inc()
        self.dispatch_duration.observe(seconds)


_LOG_DROPS_HELP = "Log lines dropped because stdout was not read (the process never waits on it)."


class _ReadCounter(Collector):
    """A counter kept elsewhere as a plain int, read when scraped."""

    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name = name
        self._documentation = documentation
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())
