"""The delivery line's direct path renders what structlog would, and honours the config."""

from __future__ import annotations

import json

import pytest
import structlog

from dispatcher import logs

FIELDS = {
    "binding": "b",
    "outcome": "delivered",
    "ce_id": "id-1",
    "ce_type": "t",
    "ce_source": "/s",
    "attempts": 2,
    "status": 202,
    "duration_ms": 1.5,
    "redelivered": False,
    "reason": 'quote " and caf\u00e9',
}


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    structlog.contextvars.clear_contextvars()
    logs.configure("info", "json")


def test_direct_json_line_equals_structlogs(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", "json")
    structlog.contextvars.bind_contextvars(binding="b", extra="ctx")
    logs.get_logger().info("delivery", **FIELDS)
    written(FIELDS)
    via_structlog, direct = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert via_structlog.pop("timestamp").endswith("Z") and direct.pop("timestamp").endswith("Z")
    assert direct == via_structlog


def test_console_format_and_levels_go_through_structlog(capsys) -> None:
    logs.configure("info", "console")
    written(FIELDS)
    out = capsys.readouterr().out
    assert "delivery" in out and "ce_id=id-1" in out and not out.startswith("{")
    logs.configure("warning", "json")
    assert written(FIELDS) == 1  # filtered out, and the counter still moves
    assert capsys.readouterr().out == ""


def written(fields: dict[str, object]) -> int:
    """Add one line and flush; how many follow-ups ran."""
    lines = logs.DeliveryLines()
    ran: list[int] = []
    lines.add(fields, lambda: ran.append(1))
    lines.flush()
    return len(ran)


def test_lines_of_a_batch_are_out_before_their_counters_move(capsys) -> None:
    logs.configure("info", "json")
    lines = logs.DeliveryLines()
    seen: list[int] = []
    for n in range(3):
        lines.add(
            {**FIELDS, "ce_id": f"id-{n}"}, lambda: seen.append(capsys.readouterr().out.count("\n"))
        )
    assert capsys.readouterr().out == ""  # nothing written before the flush
    lines.flush()
    assert seen == [3, 0, 0]  # the first counter moved with all three lines already out
