from __future__ import annotations

from dispatcher.observe.metrics import RECONNECT_REASONS, Metrics, code_class, duration_buckets


def test_code_classes():
    assert [code_class(s) for s in (200, 302, 404, 503, None)] == [
        "2xx",
        "3xx",
        "4xx",
        "5xx",
        "error",
    ]


def test_a_status_outside_every_http_class_counts_as_5xx():
    """As the retry rule counts it: a broken server, not a transport error."""
    assert [code_class(s) for s in (600, 999, 99, 0, 599, 100)] == [
        "5xx",
        "5xx",
        "5xx",
        "5xx",
        "5xx",
        "error",
    ]


def test_buckets_include_each_timeout_and_a_bucket_above_the_largest():
    buckets = duration_buckets([7.0, 300.0])
    assert 7.0 in buckets and 300.0 in buckets
    assert max(buckets) > 300.0  # else timed-out attempts fall into +Inf only


def test_reconnect_reasons_start_at_zero():
    metrics = Metrics()
    for reason in RECONNECT_REASONS:
        assert (
            metrics.registry.get_sample_value("dispatcher_reconnects_total", {"reason": reason})
            == 0.0
        )


def test_blocked_gauge_is_one_while_any_connection_is_blocked():
    metrics = Metrics()
    metrics.set_blocked("consumer", True)
    metrics.set_blocked("publisher", True)
    metrics.set_blocked("consumer", False)
    assert metrics.value("dispatcher_broker_blocked") == 1
    metrics.set_blocked("publisher", False)
    assert metrics.value("dispatcher_broker_blocked") == 0


def test_breaker_series_exist_only_for_a_binding_with_a_breaker() -> None:
    metrics = Metrics()
    for name in ("plain", "guarded"):
        metrics.register_binding(name)
        metrics.binding(name)
    metrics.register_breaker("guarded", 300.0)
    sample = metrics.registry.get_sample_value
    assert sample("dispatcher_circuit_state", {"binding": "guarded"}) == 0
    assert sample("dispatcher_circuit_state", {"binding": "plain"}) is None
    labels = {"binding": "plain", "to": "open"}
    assert sample("dispatcher_circuit_transitions_total", labels) is None
