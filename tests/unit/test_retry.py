"""Which answers are retried, and how long the waits are."""

from __future__ import annotations

import pytest

from dispatcher.delivery.retry import Backoff, Decision, classify, retried_statuses


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_success(status):
    assert classify(status) is Decision.SUCCESS


@pytest.mark.parametrize(
    "status", [404, 408, 409, 429, 500, 502, 503, 504, 599, 600, 700, 999, 0, 99, None]
)
def test_retried_statuses(status):
    assert classify(status) is Decision.RETRY


@pytest.mark.parametrize("status", [300, 301, 302, 304, 307, 400, 401, 403, 405, 410, 413, 422])
def test_other_3xx_4xx_fail_at_once(status):
    assert classify(status) is Decision.FAIL


# (retry_on, status) -> verdict: a plain reading of the rule, case by case.
@pytest.mark.parametrize(
    ("retry_on", "status", "verdict"),
    [
        ((409,), 409, Decision.RETRY),
        ((409,), 503, Decision.FAIL),  # 5xx only when listed
        (("5xx",), 503, Decision.RETRY),
        (("5xx",), 409, Decision.FAIL),
        (("5xx",), 600, Decision.RETRY),  # outside every HTTP class: counts as 5xx
        (("5xx",), 999, Decision.RETRY),
        (("5xx",), 99, Decision.RETRY),
        ((503,), 600, Decision.FAIL),  # a 500, and 500 is not listed
        (("4xx",), 600, Decision.FAIL),
        (("4xx",), 400, Decision.RETRY),
        (("4xx",), 499, Decision.RETRY),
        (("4xx",), 500, Decision.FAIL),
        ((), 503, Decision.FAIL),
        ((), None, Decision.RETRY),  # timeouts and connection errors, always
        ((301, "5xx"), 301, Decision.RETRY),
        (("4xx", "5xx"), 204, Decision.SUCCESS),
    ],
)
def test_retry_on(retry_on, status, verdict):
    assert classify(status, retried_statuses(retry_on)) is verdict


def test_the_default_is_the_old_table():
    from dispatcher.delivery.retry import DEFAULT_RETRY_ON

    retried = retried_statuses(DEFAULT_RETRY_ON)
    for status in range(100, 600):
        expected = status in (404, 408, 409, 429) or status >= 500
        assert (status in retried) is expected, status


def test_exponential_and_linear_bases_are_capped():
    exponential = Backoff("exponential", 0.2, 5.0)
    linear = Backoff("linear", 0.2, 5.0)
    assert [exponential.base(n) for n in range(6)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0])
    assert [linear.base(n) for n in range(3)] == pytest.approx([0.2, 0.4, 0.6])
    assert exponential.base(10_000) == 5.0  # no overflow


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 0.8), (0.5, 1.0), (1.0, 1.2)])
def test_jitter_spreads_waits_by_twenty_percent(draw, factor):
    backoff = Backoff("exponential", 1.0, 100.0, rng=lambda: draw)
    assert backoff.wait(2) == pytest.approx(4.0 * factor)


def test_retry_after_is_honoured_but_capped():
    backoff = Backoff("exponential", 0.1, 2.0, rng=lambda: 0.5)
    assert backoff.wait(0, retry_after=1.5) == pytest.approx(1.5)
    assert backoff.wait(0, retry_after=3600) == pytest.approx(2.0)
    assert backoff.wait(0, retry_after=0.0) == pytest.approx(0.1)  # never shorter than ours


def test_reconnect_style_wider_jitter():
    low = Backoff("exponential", 0.2, 30.0, rng=lambda: 0.0, jitter=0.5)
    high = Backoff("exponential", 0.2, 30.0, rng=lambda: 1.0, jitter=0.5)
    assert low.wait(3) == pytest.approx(1.6 * 0.5)
    assert high.wait(3) == pytest.approx(1.6 * 1.5)
    assert high.wait(20) == pytest.approx(30.0)  # capped after jitter too
