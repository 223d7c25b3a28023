"""docs/modules.md is what the modules' docstrings say (tests/support/module_map.py)."""

from __future__ import annotations

from tests.support.module_map import PACKAGE, TARGET, first_line, render


def test_the_module_map_is_current() -> None:
    assert TARGET.read_text() == render(), "stale: run `make modules`"


def test_every_module_says_what_it_owns() -> None:
    silent = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if not first_line(p))
    assert silent == []
