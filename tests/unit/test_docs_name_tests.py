"""The documents that name a proving test for each fault or requirement name real ones.

``docs/failure-modes.md`` and ``docs/conformance.md`` are tables whose last
column is a test; a renamed or deleted test would leave a claim without proof.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUALIFIED = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
BARE = re.compile(r"`(test_\w+)`")


def defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize(
    "document", ["README.md", *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("docs/*.md"))]
)
def test_every_named_test_exists(document: str) -> None:
    text = (ROOT / document).read_text()
    missing = [
        f"{path}::{name}"
        for path, name in QUALIFIED.findall(text)
        if not (ROOT / path).is_file() or name not in defined(ROOT / path)
    ]
    assert missing == []


def test_every_conformance_row_names_a_conformance_test() -> None:
    text = (ROOT / "docs/conformance.md").read_text()
    named = set(BARE.findall(text))
    suite = set().union(*(defined(p) for p in (ROOT / "tests/conformance").glob("test_*.py")))
    written = {name for name in suite if name.startswith("test_")}
    assert named - written == set()  # every test the table names exists
    assert written - named == set()  # and every test of the suite is a row of the table
