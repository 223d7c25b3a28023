"""What Spark does not say about local input files (``pipeline.inputs``), without Spark."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dispatcher.errors import BatchInputError
from dispatcher.pipeline import inputs


def tree(root: Path, names: list[str]) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(b"x\n") if name.endswith(".gz") else b"x\n")


def test_files_folders_and_globs_are_listed_with_the_hidden_ones(tmp_path: Path) -> None:
    tree(tmp_path, ["a.jsonl", "d/b.jsonl.gz", "d/_c.jsonl", "d/e/.f.jsonl", "g.txt"])
    names = ("*.jsonl", "*.jsonl.gz")
    listed = inputs.local_files([str(tmp_path)], names)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in listed) == [
        "a.jsonl", "d/_c.jsonl", "d/b.jsonl.gz", "d/e/.f.jsonl",
    ]  # fmt: skip
    assert inputs.local_files([str(tmp_path / "d" / "*.gz")]) == [tmp_path / "d" / "b.jsonl.gz"]
    assert inputs.local_files([f"file://{tmp_path / 'g.txt'}"]) == [tmp_path / "g.txt"]
    assert inputs.local_files(["hdfs://namenode/logs", str(tmp_path / "none")]) == []


def test_a_name_hadoop_cannot_open_is_refused_naming_it(tmp_path: Path) -> None:
    tree(tmp_path, ["ok.log", "run-10:00.log"])
    with pytest.raises(BatchInputError) as refused:
        inputs.check("--logs", inputs.local_files([str(tmp_path)]))
    assert str(refused.value).startswith("--logs: Spark cannot read a file whose name holds ':'")
    assert str(tmp_path / "run-10:00.log") in str(refused.value)


def test_files_spark_skips_are_said_in_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree(tmp_path, ["ok.log", "_fix.log", "sub/.old.log"])
    inputs.check("--logs", inputs.local_files([str(tmp_path)]))
    [line] = [json.loads(text) for text in capsys.readouterr().out.splitlines()]
    assert line["event"] == "files not read: Spark skips names that start with '_' or '.'"
    assert (line["level"], line["files"]) == ("warning", 2)
    assert sorted(line["names"]) == [str(tmp_path / "_fix.log"), str(tmp_path / "sub/.old.log")]


def test_broken_gzip_files_are_named_with_why(tmp_path: Path) -> None:
    good = gzip.compress(b"line\n" * 1000)
    (tmp_path / "good.log.gz").write_bytes(good)
    (tmp_path / "cut.log.gz").write_bytes(good[: len(good) // 2])
    (tmp_path / "plain.log.gz").write_bytes(b"not gzip at all\n")
    (tmp_path / "plain.log").write_bytes(b"not gzip, and not named so\n")
    files = inputs.local_files([str(tmp_path)])
    with pytest.raises(BatchInputError) as refused:
        inputs.refuse_broken_gzip("--logs", files)
    said = str(refused.value)
    assert f"{tmp_path / 'cut.log.gz'} (truncated: it ends inside its compressed data)" in said
    assert f"{tmp_path / 'plain.log.gz'} (Not a gzipped file" in said
    assert "good.log.gz" not in said and "plain.log " not in said
    inputs.refuse_broken_gzip("--logs", [tmp_path / "good.log.gz", tmp_path / "plain.log"])
