"""Generated delivery logs for ``dispatcher report``, and the same numbers in plain Python.

``write_logs`` makes a folder of log files as operators would collect them:
several bindings and event types, duplicates (a ``ce_id`` delivered twice),
every outcome, plain and gzip files, a ``kubectl logs --timestamps`` prefix on
some lines, and junk: other log lines, console-format lines, truncated and
ill-typed records. ``expected`` computes the report's tables from the lines
with nothing but the standard library, following ``report.DELIVERY_RULES``.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

BINDINGS = ("orders", "payments", "audit")
TYPES = ("com.example.order.created", "com.example.order.paid", "com.example.audit")
OUTCOMES = ("delivered", "dead_lettered", "requeued", "rejected")
JUNK = (
    '{"event": "publisher connected", "level": "info", "timestamp": "2026-11-20T10:00:00Z"}',
    "2026-11-20 10:00:00 [info     ] delivery   binding=orders outcome=delivered",
    "",
    '{"event": "delivery", "binding": "orders", "outcome": "delivered", "ce_id": "trunc',
    "Traceback (most recent call last):",
    "not json at all {",
)
# Delivery-looking lines that break one rule each: skipped as malformed.
MALFORMED = (
    {"status": "abc"},
    {"attempts": -1},
    {"attempts": 1.5},
    {"duration_ms": -3.0},
    {"outcome": "vanished"},
    {"binding": 7},
    {"ce_id": ""},
    {"ce_type": None},
    {"status": True},
)


def record(rng: random.Random, index: int) -> dict[str, Any]:
    binding = BINDINGS[index % len(BINDINGS)]
    outcome = rng.choices(OUTCOMES, weights=(85, 8, 5, 2))[0]
    if outcome == "delivered":
        status = rng.choice((200, 202, 204))
        attempts = rng.choices((1, 2, 3), weights=(90, 8, 2))[0]
    else:
        status = rng.choice((400, 404, 410, 500, 503, -1))
        attempts = rng.randint(1, 6)
    return {
        "binding": binding,
        "outcome": outcome,
        "ce_id": f"{binding}-{index}",
        "ce_type": rng.choice(TYPES),
        "ce_source": f"/{binding}",
        "attempts": attempts,
        "status": status,
        "duration_ms": round(rng.lognormvariate(3.0, 1.0), 3),
        "redelivered": False,
        "event": "delivery",
        "level": "info",
        "timestamp": f"2026-11-20T10:{index // 60 % 60:02d}:{index % 60:02d}Z",
    }


def lines(count: int, seed: int = 7, junk_every: int = 40) -> Iterator[str]:
    """``count`` delivery records plus junk, duplicates and malformed ones in between."""
    rng = random.Random(seed)
    for index in range(count):
        entry = record(rng, index)
        yield _render(rng, entry)
        if entry["outcome"] == "delivered" and rng.random() < 0.02:
            # A second delivery of the same event (a duplicate the report must count).
            yield _render(rng, {**entry, "redelivered": True})
        if index % junk_every == 0:
            yield rng.choice(JUNK)
        if index % (junk_every * 3) == 1:
            yield json.dumps({**entry, **rng.choice(MALFORMED)})


def _render(rng: random.Random, entry: dict[str, Any]) -> str:
    text = json.dumps(entry)
    if rng.random() < 0.1:  # kubectl logs --timestamps / CRI prefix
        return f"2026-11-20T10:00:00.000000000Z stdout F {text}"
    return text


def write_logs(folder: Path, count: int, files: int = 4, seed: int = 7) -> list[str]:
    """Write the lines over ``files`` files (every other one gzip); returns all lines."""
    folder.mkdir(parents=True, exist_ok=True)
    everything = list(lines(count, seed))
    size = math.ceil(len(everything) / files)
    for n in range(files):
        chunk = "".join(line + "\n" for line in everything[n * size : (n + 1) * size])
        if n % 2:
            with gzip.open(folder / f"dispatcher-{n}.log.gz", "wt", encoding="utf-8") as f:
                f.write(chunk)
        else:
            (folder / f"dispatcher-{n}.log").write_text(chunk, encoding="utf-8")
    return everything


def incident_lines(
    bindings: int = 20, outage: tuple[int, int] = (13 * 60, 13 * 60 + 10), seed: int = 3
) -> Iterator[str]:
    """A day of delivery lines (UTC, 2026-11-20) from ``bindings`` bindings, the
    first (``orders``) busiest, whose subscriber is down from minute ``outage[0]``
    to ``outage[1]``: every event then dead-lettered after its retries, slowly."""
    rng = random.Random(seed)
    names = ["orders", *(f"binding-{i:02d}" for i in range(1, bindings))]
    for minute in range(24 * 60):
        for index, name in enumerate(names):
            for n in range(5 if index == 0 else 1 + index % 3):
                down = index == 0 and outage[0] <= minute < outage[1]
                took = rng.uniform(9000, 12000) if down else rng.lognormvariate(2.0, 0.5)
                at = f"{minute // 60:02d}:{minute % 60:02d}:{rng.uniform(0, 59.999):09.6f}"
                yield json.dumps(
                    {
                        "binding": name,
                        "outcome": "dead_lettered" if down else "delivered",
                        "ce_id": f"{name}-{minute}-{n}",
                        "ce_type": TYPES[n % len(TYPES)],
                        "ce_source": f"/{name}",
                        "attempts": 6 if down else 1,
                        "status": 503 if down else 202,
                        "duration_ms": round(took, 3),
                        "redelivered": False,
                        "event": "delivery",
                        "level": "info",
                        "timestamp": f"2026-11-20T{at}Z",
                    }
                )


# --------------------------------------------------------------------- the reference


def classify(line: str) -> tuple[str, dict[str, Any] | None]:
    start = line.find("{")
    if start < 0:
        return "not_delivery", None
    try:
        obj, _end = json.JSONDecoder().raw_decode(line[start:])
    except ValueError:
        return "not_delivery", None
    if not isinstance(obj, dict) or obj.get("event") != "delivery":
        return "not_delivery", None
    ok = (
        all(isinstance(obj.get(k), str) for k in ("binding", "outcome", "ce_id", "ce_type"))
        and obj["binding"] != ""
        and obj["ce_id"] != ""
        and obj["outcome"] in OUTCOMES
        and _integer(obj.get("attempts"))
        and obj["attempts"] >= 0
        and _integer(obj.get("status"))
        and _number(obj.get("duration_ms"))
        and math.isfinite(obj["duration_ms"])
        and obj["duration_ms"] >= 0
    )
    return ("record", obj) if ok else ("malformed", None)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the two nearest ranks (PERCENTILE.INC), the
    report's definition, in the same floating-point steps as Spark's
    ``percentile``, rounded half up to 3 places as the report writes it."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    if low == high:
        value = ordered[low]
    else:
        value = (high - position) * ordered[low] + (position - low) * ordered[high]
    return float(Decimal(repr(value)).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def expected(all_lines: Iterable[str]) -> dict[str, Any]:
    kinds: Counter[str] = Counter()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for line in all_lines:
        kind, obj = classify(line)
        kinds[kind] += 1
        if obj is not None:
            groups[(obj["binding"], obj["ce_type"])].append(obj)
    summary = []
    for (binding, ce_type), rows in sorted(groups.items()):
        delivered = Counter(r["ce_id"] for r in rows if r["outcome"] == "delivered")
        durations = [float(r["duration_ms"]) for r in rows]
        summary.append(
            {
                "binding": binding,
                "ce_type": ce_type,
                **{o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES},
                "duplicates": sum(1 for n in delivered.values() if n > 1),
                "mean_attempts": sum(r["attempts"] for r in rows) / len(rows),
                "p50_ms": percentile(durations, 0.5),
                "p95_ms": percentile(durations, 0.95),
                "p99_ms": percentile(durations, 0.99),
            }
        )
    errors: Counter[tuple[str, int]] = Counter()
    attempts: Counter[tuple[str, str, int]] = Counter()
    for rows in groups.values():
        for r in rows:
            if not 200 <= r["status"] <= 299:
                errors[(r["binding"], r["status"])] += 1
            attempts[(r["binding"], r["ce_type"], r["attempts"])] += 1
    return {
        "lines": sum(kinds.values()),
        "records": kinds["record"],
        "not_delivery": kinds["not_delivery"],
        "malformed": kinds["malformed"],
        "summary": summary,
        "errors": dict(errors),
        "attempts": dict(attempts),
    }
