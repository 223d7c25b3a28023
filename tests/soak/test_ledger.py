"""The soak's ledger decides what a duplicate means: these cases pin its rules."""

from __future__ import annotations

from tests.soak.ledger import Fault, Ledger, Request


def ledger_with(requests: list[tuple[str, str, float, int]], publishes: int = 1) -> Ledger:
    ledger = Ledger()
    for event_id, replica, at, status in requests:
        ledger.requests.append(Request(event_id, replica, at, status))
        ledger.confirmed.add(event_id)
    for event_id in ledger.confirmed:
        ledger.publishes[event_id] = publishes
    return ledger


def classes(ledger: Ledger) -> list[str]:
    return [duplicate["class"] for duplicate in ledger.report()["duplicates"]]


def test_one_answer_per_published_copy_is_the_publishers_duplicate() -> None:
    ledger = ledger_with([("e", "a", 1.0, 200), ("e", "a", 1.1, 200)], publishes=2)
    assert classes(ledger) == ["publisher-duplicate"]


def test_more_answers_than_copies_is_unexplained() -> None:
    """Two copies published, three 2xx: one copy was sent twice."""
    answers = [("e", "a", 1.0, 200), ("e", "b", 1.1, 200), ("e", "b", 1.2, 200)]
    assert classes(ledger_with(answers, publishes=2)) == ["unexplained"]


def test_failed_attempts_are_not_duplicates() -> None:
    ledger = ledger_with([("e", "a", 1.0, 503), ("e", "a", 1.5, 200)])
    assert ledger.report()["duplicates"] == []


def test_a_second_answer_after_its_replica_was_killed_is_the_sigkill_window() -> None:
    ledger = ledger_with([("e", "a", 10.0, 200), ("e", "b", 25.0, 200)])
    ledger.faults.append(Fault("replica-sigkill", "a", 10.5, 11.0))
    assert classes(ledger) == ["sigkill"]
    ledger.faults[0] = Fault("replica-sigkill", "b", 10.5, 11.0)  # the other replica
    assert classes(ledger) == ["unexplained"]


def test_an_event_neither_delivered_nor_dead_lettered_is_lost() -> None:
    ledger = ledger_with([("e", "a", 1.0, 503)])
    ledger.confirmed.add("f")
    ledger.dead_lettered = {"f"}
    assert ledger.report()["lost"] == ["e"]


def test_an_event_delivered_and_dead_lettered_is_a_duplicate() -> None:
    """Issue 45: the subscriber's 400 dead-lettered it, and a redelivery asked again
    and got a 2xx. Its replica killed after the first answer explains it; nothing
    else does. An event only dead-lettered is no duplicate."""
    ledger = ledger_with([("e", "a", 10.0, 400), ("e", "b", 12.0, 200), ("f", "a", 10.0, 400)])
    ledger.dead_lettered = {"e", "f"}
    report = ledger.report()
    assert [(d["id"], d["class"]) for d in report["duplicates"]] == [("e", "unexplained")]
    assert report["delivered_and_dead_lettered"] == 1
    assert report["lost"] == []
    ledger.faults.append(Fault("replica-sigkill", "a", 10.5, 11.0))
    assert classes(ledger) == ["sigkill"]
