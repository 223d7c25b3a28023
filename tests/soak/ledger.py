"""The soak's ledger: what was published, what the subscriber answered, what was
dead-lettered, and every duplicate sorted by the fault window it falls in.

A duplicate is an event whose fate was decided more than once: the subscriber
answered it 2xx more than once, or answered it 2xx and it was dead-lettered too
(after another answer that decided so: issue 45). Some are docs/guarantees.md's
"Duplicates remain possible" cases, and are classified so; any other is
``unexplained``, and fails the soak, as does any event lost (confirmed by the
broker, then neither delivered nor dead-lettered).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

# Seconds of slack around a fault window: a replica notices a fault, and gets
# over it, a moment after it starts or ends.
SLACK = 3.0


@dataclass(frozen=True)
class Request:
    event_id: str
    replica: str
    at: float
    status: int


@dataclass
class Fault:
    kind: str
    target: str  # "a", "b", "both", "broker", "store", "subscriber"
    start: float
    end: float = 0.0


@dataclass
class Ledger:
    confirmed: set[str] = field(default_factory=set)
    # basic_publish calls per event: one unless a publish failed unconfirmed and was
    # sent again, so that the queue may hold that many copies.
    publishes: Counter[str] = field(default_factory=Counter)
    requests: list[Request] = field(default_factory=list)
    dead_lettered: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        answered: dict[str, list[Request]] = defaultdict(list)
        refused: dict[str, Request] = {}  # the latest answer that was not a 2xx
        for request in sorted(self.requests, key=lambda r: r.at):
            if 200 <= request.status < 300:
                answered[request.event_id].append(request)
            else:
                refused[request.event_id] = request
        delivered = set(answered)
        lost = sorted(self.confirmed - delivered - self.dead_lettered)
        duplicates = []
        for event_id, answers in sorted(answered.items()):
            found = answers
            if event_id in self.dead_lettered and event_id in refused:
                # Delivered and dead-lettered: the answer that dead-lettered it was
                # one fate, each 2xx another.
                found = sorted([*answers, refused[event_id]], key=lambda r: r.at)
            if len(found) > 1:
                duplicates.append(
                    {
                        "id": event_id,
                        "class": self.classify(event_id, found),
                        "requests": [(r.replica, round(r.at, 3)) for r in found],
                    }
                )
        by_class: dict[str, int] = defaultdict(int)
        for duplicate in duplicates:
            by_class[duplicate["class"]] += 1
        faults: dict[str, int] = defaultdict(int)
        for fault in self.faults:
            faults[fault.kind] += 1
        both = delivered & self.dead_lettered
        return {
            "published_confirmed": len(self.confirmed),
            "delivered_and_dead_lettered": len(both & self.confirmed),
            "delivered": len(delivered & self.confirmed),
            "dead_lettered": len(self.dead_lettered & self.confirmed),
            "requests": len(self.requests),
            "lost": lost,
            "duplicates_by_class": dict(by_class),
            "duplicates": duplicates,
            "faults": dict(faults),
            "fault_windows": [vars(f) for f in self.faults],
        }

    def classify(self, event_id: str, found: list[Request]) -> str:
        """The first window of docs/guarantees.md's list that explains the later requests.

        The publisher's own copies explain one 2xx each, no more: an extra answer
        for a copy is classified like any other duplicate."""
        if len(found) <= self.publishes[event_id]:
            return "publisher-duplicate"
        first, later = found[0], found[1:]
        for fault in self.faults:
            # Killed after its request reached the subscriber, before its ack.
            if (
                fault.kind == "replica-sigkill"
                and fault.target == first.replica
                and first.at - SLACK <= fault.start < first.at + 60
            ):
                return "sigkill"
        for fault in self.faults:
            if (
                fault.kind == "store-restart-empty"
                and first.at - SLACK <= fault.start <= later[-1].at
            ):
                return "store-restarted-empty"
        for request in later:
            if not any(self.store_unreachable(fault, request) for fault in self.faults):
                return "unexplained"
        return "store-unreachable"

    @staticmethod
    def store_unreachable(fault: Fault, request: Request) -> bool:
        """The request was decided while its replica could not reach the store."""
        if fault.kind != "store-blackhole" or fault.target not in ("both", request.replica):
            return False
        return fault.start - SLACK <= request.at <= fault.end + SLACK


def table(report: dict[str, Any]) -> str:
    rows = [
        ("published, confirmed", report["published_confirmed"]),
        ("delivered (2xx)", report["delivered"]),
        ("dead-lettered", report["dead_lettered"]),
        ("delivered and dead-lettered", report["delivered_and_dead_lettered"]),
        ("requests to the subscriber", report["requests"]),
        ("lost", len(report["lost"])),
    ]
    rows += [
        (f"duplicates: {name}", count) for name, count in report["duplicates_by_class"].items()
    ]
    rows += [(f"fault: {name}", count) for name, count in sorted(report["faults"].items())]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"| {name:<{width}} | {value:>8} |" for name, value in rows)
