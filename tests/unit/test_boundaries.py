"""The package's boundaries, read from its import graph.

The core (the flat modules of ``dispatcher/``: events, handler, retry, dedupe,
deadletter, reply, filters, ...) decides what happens to a message and must
never reach pika, libcurl or redis, not even through another module: the
broker side is ``dispatcher/broker/``, the HTTP side ``dispatcher/http/``, the
shared store ``dispatcher/redis_claims.py``, and only the wiring (``service``,
``cli``) puts them together. Configuration is pure data: it builds no TLS
context and no connection parameters. Every import counts, including those
inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# The outer modules: they wire the sides together, so they may import anything.
WIRING = {"dispatcher.service", "dispatcher.cli", "dispatcher.resolve", "dispatcher.__main__"}
# Top-level modules that are a boundary themselves, not core.
BOUNDARY_MODULES = {"dispatcher.redis_claims", "dispatcher.otlp", "dispatcher.otlp_encoding"}
PROTOCOL_LIBRARIES = {"pika", "pycurl", "redis", "opentelemetry"}
SIDES = ("dispatcher.broker", "dispatcher.http", "dispatcher.pipeline")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The package module ``name`` refers to (a module, or the package holding it)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def direct_imports(module: str) -> frozenset[str]:
    """Every name ``module`` imports (absolute, dotted), wherever in the file."""
    tree = ast.parse(MODULES[module].read_text())
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            # ``from dispatcher import events`` imports the module dispatcher.events.
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return frozenset(names)


@cache
def reachable(module: str) -> frozenset[str]:
    """Everything ``module`` imports, directly or through the package's own modules."""
    seen: set[str] = set()
    visited = {module}
    todo = [module]
    while todo:
        for name in direct_imports(todo.pop()):
            seen.add(name)
            inner = _resolve(name) if name.startswith("dispatcher") else None
            if inner is not None and inner not in visited:
                visited.add(inner)
                seen.add(inner)
                todo.append(inner)
    return frozenset(seen)


def _top_level(name: str) -> str:
    return name.partition(".")[0]


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


CORE = sorted(
    name
    for name, path in MODULES.items()
    if path.parent == PACKAGE and name not in WIRING | BOUNDARY_MODULES and name != "dispatcher"
)
CONFIG = sorted(n for n in MODULES if _within(n, ("dispatcher.config",)))


def test_the_graph_sees_what_it_should() -> None:
    # The test's own reading of imports: the HTTP client reaches pycurl, the
    # supervisor pika, the service both; if these failed, the rules below
    # would pass vacuously.
    assert "pycurl" in {_top_level(n) for n in reachable("dispatcher.http.client")}
    assert "pika" in {_top_level(n) for n in reachable("dispatcher.broker.supervisor")}
    service = {_top_level(n) for n in reachable("dispatcher.service")}
    assert {"pika", "pycurl", "redis"} <= service
    assert "dispatcher.handler" in CORE and "dispatcher.events" in CORE


@pytest.mark.parametrize("module", CORE)
def test_the_core_never_reaches_a_protocol_library_or_a_side(module: str) -> None:
    reached = reachable(module)
    libraries = sorted({_top_level(n) for n in reached} & PROTOCOL_LIBRARIES)
    sides = sorted(n for n in reached if _within(n, SIDES))
    assert not libraries, f"{module} reaches {libraries}"
    assert not sides, f"{module} reaches {sides}"


@pytest.mark.parametrize("module", CONFIG)
def test_configuration_is_pure_data(module: str) -> None:
    reached = reachable(module)
    forbidden = sorted({_top_level(n) for n in reached} & (PROTOCOL_LIBRARIES | {"ssl"}))
    sides = sorted(n for n in reached if _within(n, SIDES))
    assert not forbidden, f"{module} reaches {forbidden}"
    assert not sides, f"{module} reaches {sides}"


@pytest.mark.parametrize("side", ["dispatcher.broker", "dispatcher.http"])
def test_a_side_does_not_reach_the_other_or_the_wiring(side: str) -> None:
    other = "dispatcher.http" if side == "dispatcher.broker" else "dispatcher.broker"
    for module in (n for n in MODULES if _within(n, (side,))):
        reached = reachable(module)
        assert not any(_within(n, (other,)) for n in reached), module
        assert not reached & WIRING, module


# The modules that decide a message's fate; what they exchange with the broker
# side (Received, Action, ChannelState) lives in ``dispatcher.seams``.
DECIDING = {
    "dispatcher.handler",
    "dispatcher.engine",
    "dispatcher.deadletter",
    "dispatcher.reply",
    "dispatcher.dedupe",
    "dispatcher.requeues",
}


@pytest.mark.parametrize("module", sorted(n for n in MODULES if _within(n, ("dispatcher.broker",))))
def test_the_broker_side_imports_what_crosses_from_the_seams_not_from_the_core(
    module: str,
) -> None:
    imported = {_resolve(n) for n in direct_imports(module) if n.startswith("dispatcher")}
    assert not imported & DECIDING, f"{module} imports {sorted(imported & DECIDING)}"


def test_configuration_and_retry_do_not_import_each_other() -> None:
    assert not any(_within(n, ("dispatcher.config",)) for n in reachable("dispatcher.retry"))
