"""``report.png``: what an operator looks at first after an incident.

Top row, per binding over the whole input: latency percentiles and outcome
totals. Below it, one row per binding over time (UTC, a point a minute):
outcomes per minute, stacked (when did dead letters start and stop, when did
retries pile up), and p95 latency per minute. Rows come in trouble order: the
bindings with the most events not delivered first, then the busiest. With more
than ``SHOWN`` bindings, ``SHOWN - 1`` get a row each and the rest are summed
in one row (their p95 is computed over their records together, not averaged).
Legends sit outside the data, on the right.

matplotlib (in the ``pipeline`` extra) with the Agg backend: no display, no
GUI toolkit, the same picture on a laptop and in a cluster driver.
"""

from __future__ import annotations

import datetime as dt
import io
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OUTCOME_COLOURS: Final = {
    "delivered": "#2e7d32",
    "dead_lettered": "#c62828",
    "requeued": "#f9a825",
    "rejected": "#6a1b9a",
}
PERCENTILE_COLUMNS: Final = ("p50_ms", "p95_ms", "p99_ms")
# Rows over time at most: the busiest bindings, then the rest summed.
SHOWN: Final = 6
OTHERS: Final = "(other bindings)"
OUTSIDE: Final = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}


def shown_bindings(by_binding: Sequence[dict[str, Any]]) -> list[str]:
    """The bindings with a row of their own, in the order the rows come: those with
    the most events not delivered first (where an incident is), then the busiest;
    all of them when they fit, else ``SHOWN - 1``, the rest going to ``OTHERS``."""
    ranked = sorted(by_binding, key=_trouble_first)
    return [row["binding"] for row in ranked[: SHOWN if len(ranked) <= SHOWN else SHOWN - 1]]


def _trouble_first(row: dict[str, Any]) -> tuple[int, int, str]:
    failed = sum(int(row[o]) for o in OUTCOME_COLOURS if o != "delivered")
    return (-failed, -(failed + int(row["delivered"])), row["binding"])


def render(by_binding: Sequence[dict[str, Any]], timeline: Sequence[dict[str, Any]]) -> bytes:
    """The chart as PNG bytes."""
    from matplotlib import pyplot as plt

    picture = figure(by_binding, timeline)
    try:
        png = io.BytesIO()
        picture.savefig(png, format="png", bbox_inches="tight")
        return png.getvalue()
    finally:
        plt.close(picture)


def figure(by_binding: Sequence[dict[str, Any]], timeline: Sequence[dict[str, Any]]) -> Figure:
    """``by_binding``: a row per binding (outcome totals, percentiles);
    ``timeline``: a row per group (a binding, or ``OTHERS``) and minute
    (``minute``: epoch seconds), with outcome counts and ``p95_ms``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    present = {row["group"] for row in timeline}
    groups = [g for g in shown_bindings(by_binding) if g in present]
    groups += [OTHERS] if OTHERS in present else []
    rows = 1 + max(len(groups), 1)
    picture, axes = plt.subplots(
        rows, 2, figsize=(15, 3.2 * rows), dpi=90, squeeze=False, layout="constrained"
    )
    _overview(axes[0][0], axes[0][1], by_binding)
    if not groups:
        for empty in axes[1]:
            empty.set_axis_off()
            empty.text(0.5, 0.5, "no timestamped records", ha="center", transform=empty.transAxes)
        return picture
    minutes = _minutes(timeline)
    others = len(by_binding) - len(groups) + 1 if OTHERS in groups else 0
    by_group: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for row in timeline:
        by_group[row["group"]][int(row["minute"])] = row
    for index, group in enumerate(groups, start=1):
        label = f"{others} other bindings, together" if group == OTHERS else group
        _over_time(axes[index][0], axes[index][1], label, minutes, by_group[group])
    return picture


def _overview(latency: Axes, outcomes: Axes, by_binding: Sequence[dict[str, Any]]) -> None:
    names = [row["binding"] for row in by_binding] or ["(no records)"]
    positions = list(range(len(names)))
    bar = 0.8 / len(PERCENTILE_COLUMNS)
    for i, column in enumerate(PERCENTILE_COLUMNS):
        values = [row[column] or 0.0 for row in by_binding]
        offsets = [p + (i - 1) * bar for p in positions][: len(values)]
        latency.bar(offsets, values, bar, label=column.removesuffix("_ms"))
    latency.set_title("Latency per binding (first attempt to outcome)")
    latency.set_ylabel("ms")
    latency.legend(**OUTSIDE)
    bottoms = [0.0] * len(by_binding)
    for outcome, colour in OUTCOME_COLOURS.items():
        values = [float(row[outcome]) for row in by_binding]
        outcomes.bar(positions[: len(values)], values, 0.6, bottom=bottoms, label=outcome,
                     color=colour)  # fmt: skip
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    outcomes.set_title("Outcomes per binding, whole input")
    outcomes.set_ylabel("events")
    outcomes.legend(**OUTSIDE)
    size = 9 if len(names) <= 8 else 7
    for axes in (latency, outcomes):
        axes.set_xticks(positions, names, rotation=30 if len(names) <= 8 else 90, ha="right",
                        fontsize=size)  # fmt: skip


def _minutes(timeline: Sequence[dict[str, Any]]) -> list[int]:
    """Every minute from the first to the last: a minute without records is a
    zero, not a line drawn across the gap."""
    seen = [int(row["minute"]) for row in timeline]
    return list(range(min(seen), max(seen) + 60, 60))


def _over_time(
    counts: Axes, latency: Axes, label: str, minutes: list[int], rows: dict[int, dict[str, Any]]
) -> None:
    from matplotlib import dates

    # matplotlib's date numbers (days since its epoch): what its date axes read.
    moments = [dt.datetime.fromtimestamp(m, dt.UTC) for m in minutes]
    times = [float(x) for x in dates.date2num(moments)]  # type: ignore[no-untyped-call]
    stacked = [[float(rows[m][o]) if m in rows else 0.0 for m in minutes] for o in OUTCOME_COLOURS]
    counts.stackplot(times, stacked, labels=list(OUTCOME_COLOURS),
                     colors=list(OUTCOME_COLOURS.values()), step="post")  # fmt: skip
    counts.set_title(f"{label}: outcomes per minute")
    counts.set_ylabel("events / min")
    counts.legend(**OUTSIDE)
    p95 = [rows[m]["p95_ms"] if m in rows else float("nan") for m in minutes]
    latency.plot(times, p95, color="#1565c0", linewidth=1.0, label="p95")
    latency.set_title(f"{label}: p95 latency per minute")
    latency.set_ylabel("ms")
    latency.legend(**OUTSIDE)
    for axes in (counts, latency):
        axes.set_xlabel("time (UTC)")
        axes.xaxis_date(dt.UTC)
        axes.xaxis.set_major_formatter(dates.DateFormatter("%H:%M", tz=dt.UTC))  # type: ignore[no-untyped-call]
        axes.set_xlim(times[0], times[-1] if len(times) > 1 else times[0] + 1 / 1440)
