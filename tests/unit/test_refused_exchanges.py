"""Which exchange the broker refused, and for how long publishes to it fail unsent."""

from __future__ import annotations

import pika.exceptions

from dispatcher.broker.refused_exchanges import RefusedExchanges

NOT_FOUND = "NOT_FOUND - no exchange 'orders.replies' in vhost '/'"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def closed(code: int, text: str) -> pika.exceptions.ChannelClosedByBroker:
    return pika.exceptions.ChannelClosedByBroker(code, text)


def test_a_refused_exchange_fails_unsent_until_a_wait_that_doubles() -> None:
    clock = Clock()
    refused = RefusedExchanges(clock)
    exchange, wait = refused.refused(closed(404, NOT_FOUND)) or ("", 0.0)
    assert exchange == "orders.replies" and 0.8 <= wait <= 1.2
    why = refused.why_not("orders.replies")
    assert why is not None and "404 NOT_FOUND" in why
    assert refused.why_not("other") is None  # only the exchange it named
    clock.now += wait + 0.01
    assert refused.why_not("orders.replies") is None  # tried again
    _exchange, second = refused.refused(closed(404, NOT_FOUND)) or ("", 0.0)
    assert 1.6 <= second <= 2.4
    refused.accepted("orders.replies")  # a confirm: forgotten
    assert refused.why_not("orders.replies") is None


def test_the_broker_names_the_exchange_in_each_refusal() -> None:
    refused = RefusedExchanges(Clock())
    texts = {
        "a": "ACCESS_REFUSED - access to exchange 'a' in vhost '/' refused for user 'u'",
        "b": "ACCESS_REFUSED - cannot publish to internal exchange 'b' in vhost '/'",
        "c's": "NOT_FOUND - no exchange 'c's' in vhost 'v'",
    }
    for name, text in texts.items():
        found = refused.refused(closed(403 if "ACCESS" in text else 404, text))
        assert found is not None and found[0] == name


def test_other_closes_are_not_remembered() -> None:
    refused = RefusedExchanges(Clock())
    assert refused.refused(closed(406, "PRECONDITION_FAILED - unknown delivery tag 7")) is None
    assert refused.refused(closed(404, "NOT_FOUND - no queue 'q' in vhost '/'")) is None
    assert refused.refused(closed(403, "ACCESS_REFUSED - something else")) is None
