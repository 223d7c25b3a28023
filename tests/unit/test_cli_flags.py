"""The batch commands' folder flags: refused by argparse (exit 2) before anything runs."""

from __future__ import annotations

import pytest

from dispatcher import cli


@pytest.mark.parametrize(
    "argv",
    [
        ["archive", "--queue", "q", "--out", ""],
        ["report", "--logs", "x.log", "--out", " "],
        ["replay", "--archive", "", "--exchange", "x"],
        ["replay", "--archive", "a", "--exchange", "x", "--out", ""],
    ],
)
def test_an_empty_folder_is_refused_not_read_as_the_current_directory(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out ""`` wrote the archive into the current directory."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--exchange", "--routing-key"])
def test_an_amqp_name_longer_than_a_short_string_is_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """pika's ShortStringTooLong crashed the command (exchange) or failed every
    record (routing key)."""
    argv = ["replay", "--archive", "a", "--exchange", "x", flag, "\u00e9" * 128]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "must be at most 255 bytes" in capsys.readouterr().err


def test_a_report_written_inside_its_logs_folder_is_refused(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The next run read the report's own files as log lines, counted as skipped."""
    logs = tmp_path / "logs"
    logs.mkdir()
    for given in (str(logs), f"file://{logs}", str(logs / "*.log")):
        assert cli.main(["report", "--logs", given, "--out", str(logs / "report")]) == 2
        assert "is inside --logs" in capsys.readouterr().err
        assert not (logs / "report").exists()
