"""``dispatcher report`` on generated logs, checked against a plain-Python computation."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher import cli
from dispatcher.pipeline import chart, report
from tests.support import delivery_logs

pytestmark = pytest.mark.spark

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as stream:
        reader = csv.DictReader(stream)
        return list(reader.fieldnames or []), list(reader)


def run_report(logs: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = cli.main(["report", "--logs", *logs, "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("logs")
    lines = delivery_logs.write_logs(folder, 6000, files=4)
    return folder, delivery_logs.expected(lines)


def assert_matches_reference(out: Path, expected: dict[str, Any]) -> None:
    columns, summary = read_csv(out / "summary.csv")
    assert columns == list(report.SUMMARY_COLUMNS)
    assert [(r["binding"], r["ce_type"]) for r in summary] == [
        (r["binding"], r["ce_type"]) for r in expected["summary"]
    ]
    for got, want in zip(summary, expected["summary"], strict=True):
        for name in (*delivery_logs.OUTCOMES, "duplicates"):
            assert int(got[name]) == want[name], (got, want, name)
        assert float(got["mean_attempts"]) == pytest.approx(want["mean_attempts"], abs=1e-4)
        for name in ("p50_ms", "p95_ms", "p99_ms"):
            # Exact, not approximate: the same number as the plain-Python oracle.
            assert float(got[name]) == pytest.approx(want[name], abs=1e-9), (got, want, name)
    columns, errors = read_csv(out / "errors.csv")
    assert columns == list(report.ERRORS_COLUMNS)
    assert {(r["binding"], int(r["status"])): int(r["count"]) for r in errors} == expected["errors"]
    _, attempts = read_csv(out / "attempts.csv")
    assert {
        (r["binding"], r["ce_type"], int(r["attempts"])): int(r["count"]) for r in attempts
    } == expected["attempts"]


def test_report_matches_a_plain_python_computation(
    spark: Any, generated: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    folder, expected = generated
    # The generator must have made what this test is about.
    assert expected["not_delivery"] > 0 and expected["malformed"] > 0
    assert any(row["duplicates"] > 0 for row in expected["summary"])
    assert any(folder.glob("*.gz")) and any(folder.glob("*.log"))

    printed = run_report([str(folder)], tmp_path, capsys)

    assert_matches_reference(tmp_path, expected)
    skipped = expected["not_delivery"] + expected["malformed"]
    assert f"skipped {skipped} " in printed
    counts = json.loads((tmp_path / "counts.json").read_text())
    assert counts == {
        "lines": expected["lines"],
        "records": expected["records"],
        "skipped": skipped,
        "not_delivery": expected["not_delivery"],
        "malformed": expected["malformed"],
    }


def test_parquet_tables_hold_the_csv_rows(
    spark: Any, generated: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    run_report([str(generated[0])], tmp_path, capsys)
    for name in ("summary", "errors", "attempts"):
        _, rows = read_csv(tmp_path / f"{name}.csv")
        table = spark.read.parquet(str(tmp_path / f"{name}.parquet"))
        assert table.columns == list(read_csv(tmp_path / f"{name}.csv")[0])
        from_parquet = sorted(tuple(str(v) for v in row) for row in table.collect())
        assert from_parquet == sorted(tuple(r.values()) for r in rows)


def test_markdown_and_chart(
    spark: Any, generated: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    folder, expected = generated
    run_report([str(folder)], tmp_path, capsys)
    text = (tmp_path / "summary.md").read_text()
    assert f"- delivery records: {expected['records']}" in text
    for row in expected["summary"]:
        assert f"| {row['binding']} | {row['ce_type']} | {row['delivered']} |" in text
    assert "report.png" in text
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    width = int.from_bytes(png[16:20], "big")
    height = int.from_bytes(png[20:24], "big")
    assert width >= 600 and height >= 300


def test_the_chart_s_rows_over_time_show_an_outage_where_and_when_it_was(
    spark: Any, tmp_path: Path
) -> None:
    """A day of 20 bindings; ``orders`` down for ten minutes from 13:00 UTC."""
    logs = tmp_path / "day.log"
    logs.write_text("".join(line + "\n" for line in delivery_logs.incident_lines()))
    built = report.build(spark, [str(logs)])
    groups = {row["group"] for row in built.timeline}
    assert groups == {*chart.shown_bindings(built.by_binding), chart.OTHERS}
    assert "orders" in groups and len(groups) == chart.SHOWN
    day = 1_795_132_800  # 2026-11-20T00:00:00Z
    dead = {
        (row["minute"] - day) // 60
        for row in built.timeline
        if row["group"] == "orders" and row["dead_lettered"]
    }
    assert dead == set(range(13 * 60, 13 * 60 + 10))
    minutes = [row for row in built.timeline if row["group"] == chart.OTHERS]
    assert len(minutes) == 24 * 60
    # Every record is in exactly one minute of one row.
    assert sum(row[o] for row in built.timeline for o in report.OUTCOMES) == built.records
    slow = [row["p95_ms"] for row in built.timeline if row["group"] == "orders"]
    assert max(slow) >= 9000 and min(slow) < 100
    png = chart.render(built.by_binding, built.timeline)
    assert png.startswith(PNG_SIGNATURE)


def test_files_and_globs_select_what_they_name(
    spark: Any, generated: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    folder, _ = generated
    gz_files = sorted(str(p) for p in folder.glob("*.gz"))
    expected = delivery_logs.expected(
        line
        for path in gz_files
        for line in __import__("gzip").open(path, "rt").read().splitlines()
    )
    run_report([str(folder / "*.gz")], tmp_path / "glob", capsys)
    assert_matches_reference(tmp_path / "glob", expected)
    run_report(gz_files, tmp_path / "files", capsys)
    assert_matches_reference(tmp_path / "files", expected)


def test_a_path_that_matches_nothing_is_exit_2_naming_it(
    spark: Any, tmp_path: Path, capsys: Any
) -> None:
    missing = str(tmp_path / "no-such-logs")
    code = cli.main(["report", "--logs", missing, "--out", str(tmp_path / "out")])
    assert code == 2
    assert f"nothing matches {missing}" in capsys.readouterr().err


def test_without_pyspark_exit_2_with_advice(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)  # import pyspark -> ImportError
    for argv in (
        ["report", "--logs", str(tmp_path), "--out", str(tmp_path / "out")],
        ["replay", "--archive", str(tmp_path), "--exchange", "x"],
    ):
        assert cli.main(argv) == 2
        assert "pip install 'dispatcher[pipeline]'" in capsys.readouterr().err


def test_logs_without_a_single_delivery_record(spark: Any, tmp_path: Path, capsys: Any) -> None:
    logs = tmp_path / "console.log"
    logs.write_text("".join(line + "\n" for line in delivery_logs.JUNK))
    printed = run_report([str(logs)], tmp_path / "out", capsys)
    assert f"0 delivery records, skipped {len(delivery_logs.JUNK)} " in printed
    columns, rows = read_csv(tmp_path / "out" / "summary.csv")
    assert (columns, rows) == (list(report.SUMMARY_COLUMNS), [])
    assert (tmp_path / "out" / "report.png").read_bytes().startswith(PNG_SIGNATURE)


def test_the_rest_s_row_over_time_holds_every_binding_not_shown(spark: Any, tmp_path: Path) -> None:
    """Seven bindings: the five in trouble get a row each, the other two share
    ``chart.OTHERS``. The shown ones log no readable timestamp, so the rows over
    time come from the two others alone, and must all be there."""

    def line(binding: str, n: int, outcome: str, timestamp: str | None) -> str:
        record = {
            "event": "delivery",
            "binding": binding,
            "outcome": outcome,
            "ce_id": f"{binding}-{n}",
            "ce_type": "t",
            "attempts": 1,
            "status": 200 if outcome == "delivered" else 400,
            "duration_ms": float(n),
        }
        if timestamp is not None:
            record["timestamp"] = timestamp
        return json.dumps(record) + "\n"

    troubled = [f"troubled-{i}" for i in range(5)]
    quiet = ["quiet-a", "quiet-b"]
    lines = [line(b, n, "dead_lettered", None) for b in troubled for n in range(3)]
    lines += [
        line(b, n, "delivered", f"2026-11-20T10:0{n}:30Z") for b in quiet for n in range(1, 5)
    ]
    logs = tmp_path / "day.log"
    logs.write_text("".join(lines))

    built = report.build(spark, [str(logs)])

    assert chart.shown_bindings(built.by_binding) == troubled
    assert [row["group"] for row in built.timeline] == [chart.OTHERS] * 4
    day = 1_795_132_800  # 2026-11-20T00:00:00Z
    assert [(row["minute"] - day - 10 * 3600) // 60 for row in built.timeline] == [1, 2, 3, 4]
    # Both quiet bindings in each minute: durations n and n, so p95 is n.
    assert [(row["delivered"], row["p95_ms"]) for row in built.timeline] == [
        (2, 1.0), (2, 2.0), (2, 3.0), (2, 4.0)
    ]  # fmt: skip


def test_a_broken_gzip_file_is_exit_2_naming_it_not_a_crash(
    spark: Any, generated: tuple[Path, dict[str, Any]], tmp_path: Path, capsys: Any
) -> None:
    """Spark stops the whole job at a truncated .gz with an EOFException that names
    no file; the command said 'report crashed' with a Java trace."""
    folder, _ = generated
    logs = tmp_path / "logs"
    logs.mkdir()
    whole = next(folder.glob("*.gz")).read_bytes()
    (logs / "rotated.log.gz").write_bytes(whole[: len(whole) // 2])
    code = cli.main(["report", "--logs", str(logs), "--out", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"--logs: cannot read {logs / 'rotated.log.gz'} (truncated" in err
    assert "crashed" not in err
