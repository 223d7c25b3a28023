"""Matching the broker's confirms and returns to the publishes in flight on one channel."""

from __future__ import annotations

from dispatcher.broker.confirm_window import NACKED, ConfirmWindow


def window_with(*keys: str) -> ConfirmWindow[str]:
    window: ConfirmWindow[str] = ConfirmWindow()
    for number, key in enumerate(keys, start=1):
        assert window.sent(key, f"{key}#{number}") == number  # tags count from 1
    return window


def test_a_single_ack_settles_its_own_tag_only():
    window = window_with("a", "b", "c")
    assert window.confirmed(2, multiple=False, acked=True) == [("b#2", None)]
    assert len(window) == 2


def test_a_multiple_ack_settles_every_tag_up_to_it_in_order():
    window = window_with("a", "b", "c", "d")
    window.confirmed(2, multiple=False, acked=True)
    assert window.confirmed(3, multiple=True, acked=True) == [("a#1", None), ("c#3", None)]
    assert window.confirmed(4, multiple=True, acked=False) == [("d#4", NACKED)]
    assert len(window) == 0


def test_a_return_fails_the_oldest_unreturned_publish_with_its_key():
    window = window_with("k", "k", "other")
    window.returned("k", "unroutable")
    window.returned("k", "unroutable too")
    window.returned("nobody", "ignored")  # a return for nothing in flight changes nothing
    assert window.confirmed(3, multiple=True, acked=True) == [
        ("k#1", "unroutable"),
        ("k#2", "unroutable too"),
        ("other#3", None),
    ]


def test_an_unknown_or_repeated_confirm_settles_nothing():
    window = window_with("a")
    assert window.confirmed(5, multiple=False, acked=True) == []
    assert window.confirmed(1, multiple=False, acked=True) == [("a#1", None)]
    assert window.confirmed(1, multiple=False, acked=True) == []


def test_a_lost_channel_gives_back_everything_in_order_and_tags_restart():
    window = window_with("a", "b", "c")
    window.returned("b", "unroutable")
    window.confirmed(1, multiple=False, acked=True)
    assert window.lost() == ["b#2", "c#3"]
    assert len(window) == 0
    assert window.sent("b", "again") == 1  # a new channel: tags from 1, no stale return
    assert window.confirmed(1, multiple=False, acked=True) == [("again", None)]


def test_unsend_takes_back_a_publish_that_never_left():
    window = window_with("a")
    tag = window.sent("b", "b#2")
    window.unsend(tag)
    assert len(window) == 1
    assert window.sent("c", "c#2") == 2  # the tag is reused: the broker never saw it
