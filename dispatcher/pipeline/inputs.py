"""What Spark does not say about the local files a batch command reads.

``report`` and ``replay`` read text through Spark's file source, which reads
through Hadoop, and Hadoop

- cannot open a file whose name holds ``:`` (its ``Path`` reads the part before
  it as a URI scheme): the job dies with a ``URISyntaxException``;
- skips, without a word, every file whose name starts with ``_`` or ``.``
  (its "hidden" files), even one named on the command line;
- stops the whole job at a ``.gz`` file that is truncated or not gzip at all,
  with an ``EOFException`` or ``IOException`` that names no file.

So the local inputs (paths with no scheme, or ``file:``) are listed here before
the job: a name Hadoop cannot open is refused naming it, the files Spark will
skip are said in a warning, and after a job failed the ``.gz`` files are read
to the end here to name the broken one (nothing is read twice when all is
well). Inputs on other file systems (``hdfs://``, ``s3a://``) are Spark's alone.
"""

from __future__ import annotations

import fnmatch
import glob
import gzip
import os
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from dispatcher.errors import BatchInputError
from dispatcher.observe.logs import get_logger

log = get_logger()

_SHOWN = 5  # names listed in one message; the rest counted


def local_files(given: Sequence[str], patterns: Sequence[str] = ("*",)) -> list[Path]:
    """The files below the local paths of ``given`` (files, folders read
    recursively, globs) whose names match one of ``patterns``, as Spark lists
    them but with the hidden ones kept."""
    found: list[Path] = []
    for text in given:
        if "://" in text and not text.startswith("file:"):
            continue  # another file system: Spark's to list
        local = text.removeprefix("file://").removeprefix("file:")
        for match in sorted(glob.glob(local)) if glob.has_magic(local) else [local]:
            path = Path(match)
            if path.is_dir():
                found.extend(_below(path, patterns))
            elif path.is_file() and _matches(path.name, patterns):
                found.append(path)
    return found


def _below(folder: Path, patterns: Sequence[str]) -> Iterable[Path]:
    for root, _dirs, names in os.walk(folder):
        for name in sorted(names):
            if _matches(name, patterns):
                yield Path(root) / name


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def check(flag: str, files: Sequence[Path]) -> None:
    """Refuse what Hadoop cannot open; warn of what Spark will not read."""
    colons = [path for path in files if ":" in path.name]
    if colons:
        raise BatchInputError(
            f"{flag}: Spark cannot read a file whose name holds ':' (Hadoop reads what "
            f"comes before it as a URI scheme); rename {_listed(colons)}"
        )
    hidden = [path for path in files if path.name.startswith(("_", "."))]
    if hidden:
        log.warning(
            "files not read: Spark skips names that start with '_' or '.'",
            flag=flag,
            files=len(hidden),
            names=[str(path) for path in hidden[:_SHOWN]],
        )


def broken_gzip(files: Sequence[Path]) -> list[str]:
    """Each ``.gz`` file among ``files`` that cannot be read to its end, with why."""
    broken = []
    for path in files:
        if not path.name.endswith(".gz"):
            continue
        try:
            with gzip.open(path, "rb") as stream:
                while stream.read(1 << 20):
                    pass
        except EOFError:
            broken.append(f"{path} (truncated: it ends inside its compressed data)")
        except (OSError, zlib.error) as e:
            broken.append(f"{path} ({e})")
    return broken


def refuse_broken_gzip(flag: str, files: Sequence[Path]) -> None:
    """After a read failed: a ``BatchInputError`` naming the broken ``.gz`` files,
    if that is what failed (nothing otherwise: the caller raises its own error)."""
    broken = broken_gzip(files)
    if broken:
        raise BatchInputError(f"{flag}: cannot read {_listed(broken)}")


def _listed(items: Sequence[object]) -> str:
    shown = ", ".join(str(item) for item in items[:_SHOWN])
    more = len(items) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")
