"""The package's declared dependencies are the ones its code imports.

A module that arrives only through another package (python-dateutil came with
cloudevents) disappears the day that package drops it, and the service stops
starting. Every third-party import under ``dispatcher/`` must name a
distribution listed in ``pyproject.toml``: the runtime list for the package,
the ``pipeline`` extra for ``dispatcher/pipeline``.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dispatcher"


def _requirement_name(spec: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)
    assert match, spec
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def _declared() -> tuple[set[str], set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {_requirement_name(s) for s in project["dependencies"]}
    pipeline = {_requirement_name(s) for s in project["optional-dependencies"]["pipeline"]}
    return runtime, pipeline


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _third_party(name: str) -> bool:
    # _typeshed exists only for type checkers (imported under TYPE_CHECKING).
    return name not in {"dispatcher", "_typeshed"} and name not in sys.stdlib_module_names


def test_every_third_party_import_names_a_declared_distribution():
    runtime, pipeline = _declared()
    distributions = importlib.metadata.packages_distributions()
    undeclared: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        allowed = runtime | pipeline if "pipeline" in path.relative_to(PACKAGE).parts else runtime
        for module in sorted(filter(_third_party, _top_level_imports(path))):
            owners = {_requirement_name(d) for d in distributions.get(module, [module])}
            if not owners & allowed:
                undeclared.append(f"{path.relative_to(ROOT)}: {module} ({', '.join(owners)})")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)
