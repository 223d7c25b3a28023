"""The bearer token follows its file: rotation, rewrites in place, disappearance."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog

from dispatcher.credentials.bearer import BearerToken
from dispatcher.credentials.file_identity import RACY_SECONDS
from dispatcher.errors import TokenFileError


def header(token: str) -> str:
    return f"Authorization: Bearer {token}"


def write(path: Path, text: str, mtime: float | None = None) -> None:
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


class Clock:
    """Wall-clock time as the token sees it; files are dated relative to it."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_rotation_by_symlink_swap_is_seen_by_the_next_call(tmp_path, clock) -> None:
    # How Kubernetes projects a token: token -> ..data/token, ..data -> a dated folder.
    for name, token in (("v1", "first"), ("v2", "second")):
        (tmp_path / name).mkdir()
        write(tmp_path / name / "token", token + "\n", mtime=clock.now - 60)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "token").symlink_to("..data/token")
    bearer = BearerToken(str(tmp_path / "token"), "b", clock)
    assert bearer.header() == header("first")
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    assert bearer.header() == header("second")


def test_a_rewrite_in_place_keeping_size_and_times_is_seen(tmp_path, clock, monkeypatch) -> None:
    """The filesystem's timestamps are coarse: a same-size rewrite within one tick keeps
    every stat field. A file modified moments before it was read is read again."""
    path = tmp_path / "token"
    write(path, "aaaa", mtime=clock.now)
    before = path.stat()
    bearer = BearerToken(str(path), "b", clock)
    write(path, "bbbb")
    # Every field as before, as a filesystem with a coarse clock may leave them.
    with monkeypatch.context() as patched:
        patched.setattr("dispatcher.credentials.bearer.os.stat", lambda *_a, **_k: before)
        seen = bearer.header()
    assert seen == header("bbbb")


def counting_reads(monkeypatch) -> list[object]:
    reads: list[object] = []
    real_open = open

    def counting_open(*args, **kwargs):
        reads.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    return reads


@pytest.mark.parametrize(
    "age",
    [RACY_SECONDS + 1, -3600.0],  # settled; dated an hour ahead (a clock stepped back)
)
def test_an_unchanged_file_is_not_read_again(tmp_path, clock, monkeypatch, age) -> None:
    path = tmp_path / "token"
    write(path, "settled", mtime=clock.now - age)
    bearer = BearerToken(str(path), "b", clock)
    reads = counting_reads(monkeypatch)
    for _ in range(100):
        assert bearer.header() == header("settled")
    assert reads == []


@pytest.mark.parametrize("content", ["", "bad\x01token"])
def test_a_bad_file_is_read_once_until_it_changes(tmp_path, clock, monkeypatch, content) -> None:
    path = tmp_path / "token"
    write(path, "good", mtime=clock.now - 60)
    bearer = BearerToken(str(path), "b", clock)
    write(path, content, mtime=clock.now - 30)
    reads = counting_reads(monkeypatch)
    for _ in range(100):
        assert bearer.header() == header("good")
    assert len(reads) == 1
    write(path, "fixed", mtime=clock.now - 10)
    assert bearer.header() == header("fixed")


def test_a_fresh_file_is_read_again_until_it_settles(tmp_path, clock, monkeypatch) -> None:
    path = tmp_path / "token"
    write(path, "fresh", mtime=clock.now)
    bearer = BearerToken(str(path), "b", clock)
    reads = counting_reads(monkeypatch)
    bearer.header()
    assert len(reads) == 1  # still racy: read
    clock.now += RACY_SECONDS + 1
    bearer.header()  # read once more, now settled
    bearer.header()
    bearer.header()
    assert len(reads) == 2


def test_a_vanished_file_keeps_the_last_token_and_warns_once(tmp_path, clock) -> None:
    path = tmp_path / "token"
    write(path, "kept", mtime=clock.now - 60)
    bearer = BearerToken(str(path), "b", clock)
    path.unlink()
    with structlog.testing.capture_logs() as logged:
        assert [bearer.header() for _ in range(3)] == [header("kept")] * 3
        write(path, "")  # back, but empty: still failing, no second warning
        assert bearer.header() == header("kept")
        write(path, "new", mtime=clock.now - 60)
        assert bearer.header() == header("new")
        path.unlink()
        assert bearer.header() == header("new")
    assert [(e["log_level"], e["event"]) for e in logged] == [
        ("warning", "bearer token file unreadable; keeping the last token"),
        ("info", "bearer token file readable again"),
        ("warning", "bearer token file unreadable; keeping the last token"),
    ]
    assert logged[0]["binding"] == "b"
    assert logged[0]["path"] == str(path)


def test_no_log_line_ever_holds_the_token(tmp_path, clock) -> None:
    path = tmp_path / "token"
    write(path, "s3cr3t-token", mtime=clock.now - 60)
    bearer = BearerToken(str(path), "b", clock)
    with structlog.testing.capture_logs() as logged:
        write(path, "bad\x01token-s3cr3t", mtime=clock.now - 30)
        assert bearer.header() == header("s3cr3t-token")
        path.unlink()
        bearer.header()
        write(path, "s3cr3t-next", mtime=clock.now - 10)
        assert bearer.header() == header("s3cr3t-next")
    assert len(logged) == 2
    assert "s3cr3t" not in repr(logged)
    assert logged[0]["error"] == "holds characters an HTTP header cannot carry"


def test_a_token_file_that_is_gone_at_start_is_an_error(tmp_path, clock) -> None:
    with pytest.raises(TokenFileError, match="No such file"):
        BearerToken(str(tmp_path / "missing"), "b", clock)
