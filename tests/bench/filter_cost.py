"""What a binding's filter costs per event, timed alone: the W1 filters of
``make bench`` (five Knative entries, and the same five tests as one CESQL
expression) and CESQL shapes a user writes, on a bench event's attributes.

    python tests/bench/filter_cost.py

Prints microseconds per event (best of 7 runs of 200,000 calls) and the share
of a delivery's CPU that is, taking W1's 120 us per event as a delivery.
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dispatcher.config import settings_from_dict
from dispatcher.delivery.filters import compile_filter
from tests.bench.lineup import PASS_ALL_CESQL, PASS_ALL_FILTERS
from tests.bench.payload import SOURCE, TYPE

# Event.attributes of a bench event, with the publish-time extension it carries.
ATTRIBUTES = {
    "specversion": "1.0",
    "id": "w1-000123",
    "source": SOURCE,
    "type": TYPE,
    "datacontenttype": "application/json",
    "benchpublished": "1764000000.123456",
}

FILTERS: dict[str, list[dict[str, Any]]] = {
    "5 Knative entries (W1 dispatcher-filtered)": PASS_ALL_FILTERS,
    "CESQL, the same 5 tests (W1 dispatcher-cesql)": [{"cesql": PASS_ALL_CESQL}],
    "CESQL, 5 predicates with IN, a function and <": [
        {
            "cesql": f"specversion = '1.0' AND type IN ('{TYPE}', 'other') "
            f"AND source = '{SOURCE}' AND EXISTS id AND LENGTH(id) < 40"
        }
    ],
    "CESQL, one equality": [{"cesql": f"type = '{TYPE}'"}],
}
DELIVERY_US = 120.0
CALLS, RUNS = 200_000, 7


def main() -> int:
    print("| filter | us per event | share of a delivery |")
    print("|---|---|---|")
    for name, filters in FILTERS.items():
        binding = {"name": "b", "queue": "q", "subscriber": "http://127.0.0.1:1/"}
        settings = settings_from_dict({"bindings": [{**binding, "filters": filters}]}, {})
        passes = compile_filter(settings.bindings[0])
        assert passes is not None and passes(ATTRIBUTES), name
        best = min(timeit.repeat(lambda p=passes: p(ATTRIBUTES), number=CALLS, repeat=RUNS))
        micros = best / CALLS * 1e6
        print(f"| {name} | {micros:.2f} | {micros / DELIVERY_US:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
