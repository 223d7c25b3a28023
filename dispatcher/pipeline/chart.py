"""``report.png``: latency percentiles and outcomes per binding, side by side.

matplotlib (in the ``pipeline`` extra) with the Agg backend: no display, no
GUI toolkit, the same picture on a laptop and in a cluster driver.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Final

OUTCOME_COLOURS: Final = {
    "delivered": "#2e7d32",
    "dead_lettered": "#c62828",
    "requeued": "#f9a825",
    "rejected": "#6a1b9a",
}
PERCENTILE_COLUMNS: Final = ("p50_ms", "p95_ms", "p99_ms")


def render(by_binding: Sequence[dict[str, Any]]) -> bytes:
    """The chart as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    names = [row["binding"] for row in by_binding] or ["(no records)"]
    positions = range(len(names))
    width = max(8.0, 1.6 * len(names) + 4)
    figure, (latency, outcomes) = plt.subplots(1, 2, figsize=(width, 4.5), dpi=100)
    try:
        bar = 0.8 / len(PERCENTILE_COLUMNS)
        for i, column in enumerate(PERCENTILE_COLUMNS):
            values = [row[column] or 0.0 for row in by_binding]
            offsets = [p + (i - 1) * bar for p in positions][: len(values)]
            latency.bar(offsets, values, bar, label=column.removesuffix("_ms"))
        latency.set_title("Latency per binding (first attempt to outcome)")
        latency.set_ylabel("ms")
        latency.legend()
        bottoms = [0.0] * len(by_binding)
        for outcome, colour in OUTCOME_COLOURS.items():
            values = [float(row[outcome]) for row in by_binding]
            outcomes.bar(
                list(positions)[: len(values)],
                values,
                0.6,
                bottom=bottoms,
                label=outcome,
                color=colour,
            )
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
        outcomes.set_title("Outcomes per binding")
        outcomes.set_ylabel("events")
        outcomes.legend()
        for axes in (latency, outcomes):
            axes.set_xticks(list(positions), names, rotation=20, ha="right")
        figure.tight_layout()
        png = io.BytesIO()
        figure.savefig(png, format="png")
        return png.getvalue()
    finally:
        plt.close(figure)
