"""``report.png``'s panels: the overview, one row over time per busy binding and
one for the rest, legends outside the data. Checked on the figure's structure
(titles, axes, legend placement), never on pixels."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from dispatcher.pipeline import chart

START = 1_763_632_800  # 2025-11-20T10:00:00Z, on a minute


def binding_row(name: str, events: int) -> dict[str, Any]:
    return {"binding": name, "delivered": events, "dead_lettered": 0, "requeued": 0,
            "rejected": 0, "p50_ms": 5.0, "p95_ms": 20.0, "p99_ms": 50.0}  # fmt: skip


def minute_row(group: str, minute: int, delivered: int, dead: int = 0) -> dict[str, Any]:
    return {"group": group, "minute": START + 60 * minute, "delivered": delivered,
            "dead_lettered": dead, "requeued": 0, "rejected": 0, "p95_ms": 20.0}  # fmt: skip


def twenty_bindings() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    by_binding = [binding_row(f"b{i:02d}", 1000 - i) for i in range(20)]
    shown = chart.shown_bindings(by_binding)
    timeline = []
    for minute in range(60):
        for group in [*shown, chart.OTHERS]:
            outage = group == "b00" and 20 <= minute < 30
            timeline.append(minute_row(group, minute, 0 if outage else 10, 10 if outage else 0))
    return by_binding, timeline


def test_troubled_then_busy_bindings_get_rows_and_the_rest_one_together():
    few = [binding_row(f"b{i}", 10) for i in range(chart.SHOWN)]
    assert chart.shown_bindings(few) == [f"b{i}" for i in range(chart.SHOWN)]
    by_binding, _ = twenty_bindings()
    assert chart.shown_bindings(by_binding) == ["b00", "b01", "b02", "b03", "b04"]
    # A quiet binding whose events were dead-lettered comes first, not summed away.
    by_binding[17]["dead_lettered"] = 3
    assert chart.shown_bindings(by_binding) == ["b17", "b00", "b01", "b02", "b03"]


def test_twenty_bindings_make_an_overview_and_six_rows_over_time():
    by_binding, timeline = twenty_bindings()
    picture = chart.figure(by_binding, timeline)
    titles = [axes.get_title() for axes in picture.axes]
    assert titles[:2] == [
        "Latency per binding (first attempt to outcome)",
        "Outcomes per binding, whole input",
    ]
    rows = [*(f"b0{i}" for i in range(5)), "15 other bindings, together"]
    assert titles[2:] == [
        title
        for row in rows
        for title in (f"{row}: outcomes per minute", f"{row}: p95 latency per minute")
    ]
    for axes in picture.axes[2:]:
        assert axes.get_xlabel() == "time (UTC)"
    assert {axes.get_ylabel() for axes in picture.axes[2::2]} == {"events / min"}
    assert {axes.get_ylabel() for axes in picture.axes[3::2]} == {"ms"}
    # Every binding is named on the overview.
    assert [t.get_text() for t in picture.axes[1].get_xticklabels()] == [
        f"b{i:02d}" for i in range(20)
    ]


def test_legends_sit_outside_the_data():
    by_binding, timeline = twenty_bindings()
    picture = chart.figure(by_binding, timeline)
    picture.canvas.draw()
    renderer = picture.canvas.get_renderer()  # type: ignore[attr-defined]
    legends = 0
    for axes in picture.axes:
        legend = axes.get_legend()
        assert legend is not None, axes.get_title()
        legends += 1
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(axes.get_window_extent(renderer)), axes.get_title()
    assert legends == len(picture.axes)


def layer_heights(picture: Any, row: int, outcome: str) -> set[float]:
    """The y values of one outcome's layer in a row's stacked outcomes."""
    layers = picture.axes[2 * row].collections
    assert len(layers) == len(chart.OUTCOME_COLOURS)
    layer = layers[list(chart.OUTCOME_COLOURS).index(outcome)]
    return {round(float(y), 6) for path in layer.get_paths() for _x, y in path.vertices}


def test_the_outage_shows_in_its_own_row_and_a_quiet_minute_is_a_zero():
    by_binding, timeline = twenty_bindings()
    # b01 has no records in its last 20 minutes (the others go on).
    timeline = [r for r in timeline if not (r["group"] == "b01" and r["minute"] >= START + 2400)]
    picture = chart.figure(by_binding, timeline)
    # b00 (row 1): during the outage the dead-letter layer rests on 0 delivered.
    assert 0.0 in layer_heights(picture, 1, "dead_lettered")
    # b02 (row 3): nothing dead-lettered, the layer stays on top of 10 delivered.
    assert layer_heights(picture, 3, "dead_lettered") == {10.0}
    # b01 (row 2): its quiet minutes are zeros, and its p95 line has a gap there.
    assert 0.0 in layer_heights(picture, 2, "delivered")
    [p95] = picture.axes[2 * 2 + 1].get_lines()
    assert sum(math.isnan(y) for y in p95.get_ydata()) == 20  # no line across the gap
    assert chart.render(by_binding, timeline).startswith(b"\x89PNG\r\n\x1a\n")


def test_no_timestamped_records_still_makes_a_picture():
    picture = chart.figure([binding_row("b", 1)], [])
    assert [axes.get_title() for axes in picture.axes][:2] == [
        "Latency per binding (first attempt to outcome)",
        "Outcomes per binding, whole input",
    ]
    assert chart.render([], []).startswith(b"\x89PNG")
