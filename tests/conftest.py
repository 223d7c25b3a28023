"""Shared fixtures: a programmable HTTP subscriber and an in-process service
on the shared broker.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dispatcher.config import settings_from_dict
from dispatcher.observe import logs
from dispatcher.service import Service
from tests.support import broker
from tests.support.process import SERVICE_VARIABLES
from tests.support.subscriber import Subscriber

logs.configure("debug", "json")

# The service's own variables (RABBITMQ_URL, LOG_LEVEL, Knative's, the proxies) are the
# tests' to set, never the caller's: code under test that reads os.environ (cli.main,
# endpoint(), a child that inherits it) must see only what a test put there.
for _name in SERVICE_VARIABLES:
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _debug_logs() -> Iterator[None]:
    """Every test starts with the logging above: a test that runs a command
    (``cli.main``) configures it from its config (info, say), and a later test
    reading debug lines from its output found none when it ran first."""
    yield
    logs.configure("debug", "json")


@pytest.fixture
def subscriber() -> Iterator[Subscriber]:
    sub = Subscriber()
    yield sub
    sub.close()


@pytest.fixture
def make_subscriber() -> Iterator[Callable[..., Subscriber]]:
    made: list[Subscriber] = []

    def make(behaviour: Any = None) -> Subscriber:
        sub = Subscriber(behaviour)
        made.append(sub)
        return sub

    yield make
    for sub in made:
        sub.close()


def binding_config(queue: str, subscriber_url: str, **overrides: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "b",
        "queue": queue,
        "declare": {"durable": True, "type": "classic"},
        "subscriber": subscriber_url,
        "parallelism": 4,
        "delivery": {"retry": 2, "backoff_delay": "10ms", "backoff_max": "100ms", "timeout": "2s"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


class RunningService:
    def __init__(self, service: Service, queue: str) -> None:
        self.service = service
        self.queue = queue
        self.metrics = service.metrics

    def value(self, name: str, **labels: str) -> float:
        return self.metrics.value(name, labels)

    def events(self, outcome: str, binding: str = "b") -> float:
        return self.value("dispatcher_events_total", binding=binding, outcome=outcome)

    def wait_events(self, outcome: str, count: int, timeout: float = 10.0) -> None:
        broker.wait_until(
            lambda: self.events(outcome) >= count,
            timeout,
            f"{count} '{outcome}' outcomes (have {self.events(outcome)})",
        )


@pytest.fixture
def run_service() -> Iterator[Callable[..., RunningService]]:
    """Start a service with one binding ``b`` on a fresh queue; everything is deleted after."""
    started: list[Service] = []
    cleanup: list[tuple[str, list[str], list[str]]] = []

    def start(
        subscriber_url: str,
        queue: str | None = None,
        extra_queues: list[str] | None = None,
        extra_exchanges: list[str] | None = None,
        top: dict[str, Any] | None = None,
        url: str = broker.URL,
        wait_ready: bool = True,
        broker_settings: dict[str, Any] | None = None,
        **binding: Any,
    ) -> RunningService:
        queue = queue or broker.unique("q")
        cleanup.append((url, [queue, *(extra_queues or [])], list(extra_exchanges or [])))
        raw: dict[str, Any] = {
            "broker": {
                "url": url,
                "reconnect": {"initial_delay": "50ms", "max_delay": "1s"},
                **(broker_settings or {}),
            },
            "http": {"listen": "127.0.0.1:0"},
            "shutdown": {"grace": "3s"},
            "bindings": [binding_config(queue, subscriber_url, **copy.deepcopy(binding))],
            **(top or {}),
        }
        service = Service(settings_from_dict(raw, {}))
        service.start()
        started.append(service)
        if wait_ready:
            broker.wait_until(service.ready, 15, "the service to have a consumer")
        return RunningService(service, queue)

    yield start
    for service in started:
        service.request_stop()
        service.shutdown()
    for url, queues, exchanges in cleanup:
        # A fault test may leave its node stopped; its queues go with the node.
        with contextlib.suppress(Exception):
            broker.delete(queues, exchanges, url=url)


# The fault tests' recovery times (tests/faults/conftest.py puts them on the reports),
# gathered in whichever process prints the summary: the only one, or xdist's controller.
_REPORTED: list[tuple[str, float]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """How ``make test`` spreads the tests over its workers (pytest-xdist,
    ``--dist loadgroup``): the Spark tests on one worker (one Spark session, as
    on a single process), each fault module whole on one worker (its disposable
    nodes started once), the rest test by test, wherever a worker is free."""
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif item.nodeid.startswith("tests/faults/"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.partition("::")[0]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        _REPORTED.extend(value for key, value in report.user_properties if key == "recovery")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORTED:
        return
    values = [seconds for _, seconds in _REPORTED]
    terminalreporter.write_line(
        "broker back -> consuming again: "
        + ", ".join(f"{name} {seconds:.2f}s" for name, seconds in _REPORTED)
        + f" | median {statistics.median(values):.2f}s, worst {max(values):.2f}s"
    )
