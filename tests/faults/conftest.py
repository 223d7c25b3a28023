"""Disposable RabbitMQ nodes for the fault tests, and the recovery-time report."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.node import RabbitNode, make_tls_material

# Seconds from "broker reachable again" to "consuming again", across fault tests.
RECOVERY_TIMES: list[tuple[str, float]] = []


@pytest.fixture(scope="session")
def tls_material() -> Path:
    return make_tls_material(Path(tempfile.mkdtemp(prefix="dispatcher-tls-")))


@pytest.fixture(scope="session")
def node(tls_material: Path) -> Iterator[RabbitNode]:
    """One node for the fault tests that only need to stop, start and cut it."""
    started = RabbitNode(tls=tls_material).start()
    yield started
    started.shutdown()


@pytest.fixture
def live_node(node: RabbitNode) -> Iterator[RabbitNode]:
    """The shared fault node, guaranteed running again after the test whatever it did."""
    yield node
    try:
        node.wait_accepting(timeout=1)
    except Exception:
        node.start_app()


@pytest.fixture(autouse=True)
def _recovery_times_on_the_report(request: pytest.FixtureRequest) -> Iterator[None]:
    """What a test appended to RECOVERY_TIMES goes with its report, so the summary
    has it whichever process ran the test (pytest-xdist's workers print none)."""
    before = len(RECOVERY_TIMES)
    yield
    for name, seconds in RECOVERY_TIMES[before:]:
        request.node.user_properties.append(("recovery", (name, seconds)))
