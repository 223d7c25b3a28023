"""The package's boundaries, read from its import graph: one rule per package.

The folders are the boundaries. ``event/`` (the CloudEvent and its bindings),
``delivery/`` (what happens to a message), ``cesql/`` and ``config/`` are the
core: they never reach pika, libcurl, redis or OpenTelemetry, not even through
another module, and configuration builds no TLS context either. The sides
(``broker/``, ``http/``, ``store/``, ``ops/``, ``credentials/``, ``pipeline/``)
each speak to one thing outside; ``observe/`` says what the service does. Only
the wiring at the root (``service``, ``cli``, ``resolve``) puts them together.
``RULES`` says, per package, which packages of ``dispatcher`` it may import and
which protocol libraries; every import counts, including those inside
functions and under ``TYPE_CHECKING``. No module imports itself back, through
any chain: a type needed on both sides of a seam lives in the seam.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dispatcher"

# The libraries that speak a protocol (or build TLS): who may import them is a rule.
PROTOCOL_LIBRARIES = frozenset({"pika", "pycurl", "redis", "opentelemetry", "ssl"})
# Everything of the package may import these root modules (and the version).
ANYONE = frozenset({"dispatcher", "dispatcher.errors"})


@dataclass(frozen=True)
class Rule:
    uses: frozenset[str] = frozenset()  # packages (or modules) of dispatcher it may import
    libraries: frozenset[str] = frozenset()  # the protocol libraries it may import


def rule(uses: str = "", libraries: str = "") -> Rule:
    return Rule(
        frozenset(f"dispatcher.{name}" for name in uses.split()), frozenset(libraries.split())
    )


RULES: dict[str, Rule] = {
    "dispatcher": rule(),  # the version, and the package's map in its docstring
    "dispatcher.errors": rule(),
    # The core.
    "dispatcher.cesql": rule(),
    # Retry's table and backoff are the delivery keys' vocabulary; retry imports
    # nothing of the package (test_retry_imports_nothing_of_the_package).
    "dispatcher.config": rule("cesql delivery.retry"),
    "dispatcher.event": rule("config"),
    "dispatcher.delivery": rule("cesql config event loop observe"),
    # What the service says about itself, and the loop every side runs on.
    "dispatcher.observe": rule("config event", "opentelemetry"),
    "dispatcher.loop": rule("observe"),
    # The sides: each speaks to one thing outside, none to another (but replay,
    # which publishes with the broker side's confirm link).
    "dispatcher.credentials": rule("config observe", "ssl"),
    "dispatcher.broker": rule("config credentials delivery event loop observe", "pika"),
    "dispatcher.http": rule("config credentials delivery event loop observe", "pycurl ssl"),
    "dispatcher.store": rule("config delivery loop observe", "redis hiredis ssl"),
    "dispatcher.ops": rule("observe"),
    "dispatcher.pipeline": rule("broker config delivery event observe", "pika"),
    # The process: signals for every command; the wiring may import anything.
    "dispatcher.signals": rule(),
    "dispatcher.cli": rule("config observe pipeline resolve service signals"),
    "dispatcher.resolve": rule("config credentials http store", "pika redis ssl"),
    "dispatcher.service": rule("broker config delivery event http loop observe ops resolve store"),
    "dispatcher.__main__": rule("cli"),
}
# Inside observe, only the exporter reaches OpenTelemetry: with tracing off nothing loads it.
OPENTELEMETRY_MODULES = frozenset({"dispatcher.observe.otlp", "dispatcher.observe.otlp_encoding"})


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
    """Every name ``module`` imports (absolute, dotted), wherever in the file; for
    ``from X import y``, ``X.y`` when it is a module of ours, else ``X``."""
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
            for alias in node.names:
                full = f"{base}.{alias.name}"
                names.add(full if full in MODULES else base)
    return frozenset(names)


def own(module: str) -> set[str]:
    """The package's modules ``module`` imports."""
    return {
        found
        for name in direct_imports(module)
        if name.startswith("dispatcher") and (found := _resolve(name)) not in (None, module)
    }


@cache
def reachable(module: str) -> frozenset[str]:
    """Everything ``module`` imports, directly or through the package's own modules."""
    seen: set[str] = set()
    visited = {module}
    todo = [module]
    while todo:
        current = todo.pop()
        seen.update(direct_imports(current))
        for inner in own(current) - visited:
            visited.add(inner)
            seen.add(inner)
            todo.append(inner)
    return frozenset(seen)


def _top_level(name: str) -> str:
    return name.partition(".")[0]


def _within(name: str, packages: frozenset[str] | tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def package_of(module: str) -> str:
    """The entry of RULES a module falls under: its package, or the root module itself."""
    matching = [name for name in RULES if name == module or _within(module, (name,))]
    if module != "dispatcher":
        matching = [name for name in matching if name != "dispatcher"]
    assert matching, f"{module} is under no rule: give its package one"
    return max(matching, key=len)


def test_the_graph_sees_what_it_should() -> None:
    # The test's own reading of imports: the HTTP client reaches pycurl, the
    # supervisor pika, the service all three; if these failed, the rules below
    # would pass vacuously.
    assert "pycurl" in {_top_level(n) for n in reachable("dispatcher.http.client")}
    assert "pika" in {_top_level(n) for n in reachable("dispatcher.broker.supervisor")}
    service = {_top_level(n) for n in reachable("dispatcher.service")}
    assert {"pika", "pycurl", "redis"} <= service
    assert "dispatcher.delivery.seams" in own("dispatcher.delivery.handler")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_what_its_package_may(module: str) -> None:
    home = package_of(module)
    allowed = RULES[home]
    outside = {name for name in own(module) if not _within(name, (home,)) and name not in ANYONE}
    wrong = sorted(name for name in outside if not _within(name, tuple(allowed.uses)))
    assert not wrong, f"{module} ({home}) imports {wrong}"
    libraries = {_top_level(n) for n in direct_imports(module)} & PROTOCOL_LIBRARIES
    if module in OPENTELEMETRY_MODULES:
        libraries -= {"opentelemetry"}
    elif home == "dispatcher.observe":
        assert "opentelemetry" not in libraries, f"{module}: only the exporter imports it"
    extra = sorted(libraries - allowed.libraries)
    assert not extra, f"{module} ({home}) imports {extra}"


CORE = ("dispatcher.event", "dispatcher.delivery", "dispatcher.cesql", "dispatcher.config")
SIDES = (
    "dispatcher.broker",
    "dispatcher.http",
    "dispatcher.store",
    "dispatcher.ops",
    "dispatcher.credentials",
    "dispatcher.pipeline",
)
WIRING = frozenset({"dispatcher.service", "dispatcher.cli", "dispatcher.resolve"})


@pytest.mark.parametrize("module", sorted(n for n in MODULES if _within(n, CORE)))
def test_the_core_never_reaches_a_protocol_library_or_a_side(module: str) -> None:
    reached = reachable(module)
    libraries = sorted({_top_level(n) for n in reached} & PROTOCOL_LIBRARIES)
    sides = sorted(n for n in reached if _within(n, SIDES))
    assert not libraries, f"{module} reaches {libraries}"
    assert not sides, f"{module} reaches {sides}"
    assert not any(n in OPENTELEMETRY_MODULES for n in reached), module


@pytest.mark.parametrize("side", ["dispatcher.broker", "dispatcher.http"])
def test_a_side_does_not_reach_the_other_or_the_wiring(side: str) -> None:
    other = "dispatcher.http" if side == "dispatcher.broker" else "dispatcher.broker"
    for module in (n for n in MODULES if _within(n, (side,))):
        reached = reachable(module)
        assert not any(_within(n, (other,)) for n in reached), module
        assert not reached & WIRING, module


def test_where_acks_are_decided_is_reached_by_the_wiring_alone() -> None:
    """The sides see a message's handling through the seams (``Received``,
    ``Action``, ``Handle``), never the handler that decides it."""
    handler = "dispatcher.delivery.handler"
    importers = sorted(m for m in MODULES if handler in own(m) and not _within(m, CORE))
    assert set(importers) <= WIRING, importers


def test_retry_imports_nothing_of_the_package() -> None:
    """Configuration imports retry's vocabulary: retry must not import it back."""
    assert not own("dispatcher.delivery.retry")


def test_no_module_imports_itself_back() -> None:
    """Not through any chain, ``TYPE_CHECKING`` imports included: a circle is a type
    in the wrong place (Tarjan's strongly connected components of the graph)."""
    graph = {module: own(module) for module in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert circles == []


def test_every_package_has_a_rule() -> None:
    packages = {module_name(p) for p in PACKAGE.rglob("__init__.py")} - {"dispatcher"}
    top = {name for name in packages if name.count(".") == 1}
    assert top <= set(RULES), sorted(top - set(RULES))
