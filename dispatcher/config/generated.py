"""Files generated from the settings models and checked in: how they are refreshed.

``schema`` (the chart's ``values.schema.json``) and ``reference``
(``docs/configuration-keys.md``) each compute what their file should hold;
``make schema`` rewrites both, and ``--check`` (a unit test's logic) only
says whether either is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path


def refresh(path: Path, wanted: str, *, check: bool, regenerate: str) -> int:
    """Write ``wanted`` to ``path`` unless it holds it already: 0. With ``check``,
    change nothing and return 1 when it is out of date."""
    if path.exists() and path.read_text(encoding="utf-8") == wanted:
        return 0
    if check:
        print(f"{path} is out of date: run {regenerate}", file=sys.stderr)
        return 1
    path.write_text(wanted, encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return 0
