"""``report`` reads what a real ``dispatcher run`` writes: its stdout, as collected."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import cli
from tests.ops.test_operations import config, scripted
from tests.support import broker, delivery_logs
from tests.support.broker import publish, wait_until
from tests.support.process import DispatcherProcess
from tests.support.subscriber import Reply

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.timeout(180)]


@pytest.fixture
def queue() -> Iterator[str]:
    name = broker.unique("report-logs")
    yield name
    broker.delete([name])


@pytest.fixture
def service(queue: str, make_subscriber: Any, tmp_path: Path) -> Iterator[DispatcherProcess]:
    """A real `dispatcher run`: some events retried once, some refused with 400."""
    script = {f"retried-{i}": [503, 200] for i in range(4)}
    script |= {f"refused-{i}": [400] for i in range(3)}
    subscriber = make_subscriber(scripted(script))
    sink = make_subscriber(lambda _r, _i: Reply(202))
    process = DispatcherProcess(
        config(queue, subscriber.url, dead_letter={"sink": sink.url}), tmp_path
    )
    try:
        yield process
    finally:
        process.kill()


def test_report_over_the_services_own_log_lines(
    spark: Any, queue: str, service: DispatcherProcess, tmp_path: Path, capsys: Any
) -> None:
    process = service
    process.wait_for("consumer attached", binding="ops")
    ids = [f"plain-{i}" for i in range(6)]
    ids += [f"retried-{i}" for i in range(4)] + [f"refused-{i}" for i in range(3)]
    for event_id in ids:
        event_type = "dev.tests.refused" if event_id.startswith("refused") else "dev.tests.event"
        publish(queue, headers=broker.event_headers(event_id, **{"ce-type": event_type}))
    wait_until(
        lambda: sum(1 for line in process.lines if line.get("event") == "delivery") == len(ids),
        30,
        f"{len(ids)} delivery lines",
    )
    process.stop()
    logs = tmp_path / "logs" / "dispatcher.log"
    logs.parent.mkdir()
    logs.write_text(process.output())

    assert cli.main(["report", "--logs", str(logs), "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out

    expected = delivery_logs.expected(process.output().splitlines())
    assert expected["records"] == len(ids) and expected["not_delivery"] > 0
    with (tmp_path / "out" / "summary.csv").open(newline="") as stream:
        rows = {row["ce_type"]: row for row in csv.DictReader(stream)}
    assert set(rows) == {"dev.tests.event", "dev.tests.refused"}
    delivered = rows["dev.tests.event"]
    assert (delivered["delivered"], delivered["dead_lettered"]) == ("10", "0")
    assert float(delivered["mean_attempts"]) == pytest.approx((6 * 1 + 4 * 2) / 10)
    refused = rows["dev.tests.refused"]
    assert (refused["delivered"], refused["dead_lettered"], refused["mean_attempts"]) == (
        "0",
        "3",
        "1.0",
    )
    with (tmp_path / "out" / "errors.csv").open(newline="") as stream:
        assert list(csv.reader(stream)) == [["binding", "status", "count"], ["ops", "400", "3"]]
    assert f"skipped {expected['not_delivery']} " in printed
