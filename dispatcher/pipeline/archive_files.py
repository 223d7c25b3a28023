"""The files ``dispatcher archive`` writes: names, hidden temporary files, fsync.

The run (``dispatcher/pipeline/archive.py``) acks a message only once this
module has returned the files that hold it, so everything here is about when a
file may be called durable:

- **Written, flushed, fsynced, renamed, folder fsynced.** Only then does
  ``write_batch`` return. A crash (or a full disk) at any earlier point leaves
  the batch unacked and the broker redelivers it.
- **Hidden temporary names.** A file is written as ``.part-….jsonl.tmp`` and
  renamed to ``part-….jsonl``. Spark and ``replay`` skip hidden files and only
  read ``*.jsonl``, so they never see a half-written file, and whatever a
  killed archiver leaves behind is ignored.
- **A batch is all or nothing.** If one of its files cannot be written, the
  files of that batch already renamed are removed again: none of the batch is
  acked, all of it comes back from the broker, and it is archived once, later.
- **One file per date folder per batch** (``date=YYYY-MM-DD``), named
  ``part-<UTC time>-<random>.jsonl``: sortable by time, unique across runs.
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from dispatcher.errors import BatchFailed, BatchInputError
from dispatcher.observe import logs

log = logs.get_logger()


def part_name(now: dt.datetime) -> str:
    """``part-<UTC yyyymmddThhmmssZ>-<12 hex>.jsonl``: sortable by time, unique."""
    stamp = now.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"part-{stamp}-{uuid.uuid4().hex[:12]}.jsonl"


def temp_name(final_name: str) -> str:
    """The hidden name a file is written under; readers ignore it, and it is not ``*.jsonl``."""
    return f".{final_name}.tmp"


def prepare_out(out: Path) -> None:
    """Create the archive folder if needed; ``BatchInputError`` if it cannot be used."""
    try:
        if not out.is_dir():
            out.mkdir(parents=True, exist_ok=True)
            _fsync_dir(out.parent)
    except OSError as e:
        reason = os_reason(e)
        raise BatchInputError(f"--out {out}: cannot create the folder: {reason}") from e
    if not os.access(out, os.W_OK | os.X_OK):
        raise BatchInputError(f"--out {out}: folder is not writable")


def write_batch(
    out: Path, lines_by_date: Mapping[str, Sequence[bytes]], now: dt.datetime
) -> list[Path]:
    """Write one file per date folder, each durable before this returns; all or nothing.

    On failure nothing of the batch is left behind (neither temporary files nor
    files already renamed) and ``BatchFailed`` says what failed.
    """
    name = part_name(now)
    written: list[Path] = []
    try:
        for date, lines in lines_by_date.items():
            written.append(_write_file(_date_folder(out, date), name, lines))
    except OSError as e:
        for path in written:
            _remove(path)
        raise BatchFailed(f"cannot write the archive: {os_reason(e)}") from e
    return written


def os_reason(error: OSError) -> str:
    """An OSError as one line for the user: the file and what went wrong with it."""
    if error.strerror and error.filename:
        return f"{error.filename}: {error.strerror}"
    return str(error) or type(error).__name__


def _date_folder(out: Path, date: str) -> Path:
    folder = out / f"date={date}"
    try:
        folder.mkdir()
    except FileExistsError:
        return folder  # if it is not a folder, creating the file in it fails
    _fsync_dir(out)  # the new folder's entry must be durable too
    return folder


def _write_file(folder: Path, name: str, lines: Sequence[bytes]) -> Path:
    final = folder / name
    temp = folder / temp_name(name)
    try:
        with open(temp, "xb") as f:
            f.write(b"".join(line + b"\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, final)
    except BaseException:
        _remove(temp)
        raise
    try:
        _fsync_dir(folder)
    except BaseException:
        _remove(final)
        raise
    return final


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.error("cannot remove a file of a failed batch", path=str(path), error=os_reason(e))
