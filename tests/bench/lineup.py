"""The contenders: how each is launched, as one or more processes of its own.

``dispatcher`` is ``dispatcher run --config <generated yaml>`` exactly as a user
runs it (JSON delivery logs at info level, to a file). The reference
consumers and ceilings are the scripts in ``tests/bench/contenders/``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import yaml

from tests.bench import go_peer
from tests.bench.harness import PYTHON, ROOT
from tests.bench.payload import SOURCE, TYPE
from tests.bench.queues import URL

SCRIPTS: Final = ROOT / "tests/bench/contenders"


@dataclass(frozen=True, slots=True)
class Launch:
    """What a contender is pointed at in one run."""

    queue: str
    subscriber: str
    parallelism: int
    workdir: Path
    ids_file: Path
    receipt_log: Path
    binding: Mapping[str, Any] = field(default_factory=dict)  # extra dispatcher settings


def dispatcher_config(launch: Launch, index: int, top: Mapping[str, Any] | None = None) -> Path:
    binding = {
        "name": "bench",
        "queue": launch.queue,
        "subscriber": launch.subscriber,
        "parallelism": launch.parallelism,
        "delivery": {"retry": 5, "timeout": "10s"},
        **launch.binding,
    }
    config = {
        "broker": {"url": URL},
        "http": {"listen": "127.0.0.1:0"},
        **(top or {}),
        "bindings": [binding],
    }
    path = launch.workdir / f"dispatcher-{index}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _dispatcher(launch: Launch, index: int) -> list[str]:
    return [PYTHON, "-m", "dispatcher", "run", "--config", str(dispatcher_config(launch, index))]


# Five entries that every bench event passes, each dialect once: what a filter
# costs per event when it lets everything through (W1, issue 14).
PASS_ALL_FILTERS: Final = [
    {"exact": {"specversion": "1.0"}},
    {"prefix": {"type": TYPE.rsplit(".", 1)[0] + "."}},
    {"suffix": {"source": SOURCE}},
    {"any": [{"prefix": {"id": "never-"}}, {"exact": {"type": TYPE}}]},
    {"not": {"exact": {"subject": "excluded"}}},
]


# The same five tests as one CESQL expression (issue 27): ``subject`` is absent
# from bench events, so its test is guarded by EXISTS, as a user must write it.
PASS_ALL_CESQL: Final = (
    f"specversion = '1.0' AND type LIKE '{TYPE.rsplit('.', 1)[0]}.%' "
    f"AND source = '{SOURCE}' AND (id LIKE 'never-%' OR type = '{TYPE}') "
    "AND NOT (EXISTS subject AND subject = 'excluded')"
)


# The shared dedupe store (issue 13): the Redis every machine of the project runs.
DEDUPE_STORE: Final = "redis://127.0.0.1:6379/0"


def _dispatcher_store(launch: Launch, index: int) -> list[str]:
    config = dispatcher_config(launch, index, {"dedupe": {"store": DEDUPE_STORE}})
    return [PYTHON, "-m", "dispatcher", "run", "--config", str(config)]


def _dispatcher_filtered(launch: Launch, index: int) -> list[str]:
    return _dispatcher(
        replace(launch, binding={**launch.binding, "filters": PASS_ALL_FILTERS}), index
    )


def _dispatcher_cesql(launch: Launch, index: int) -> list[str]:
    filters = [{"cesql": PASS_ALL_CESQL}]
    return _dispatcher(replace(launch, binding={**launch.binding, "filters": filters}), index)


def _dispatcher_prefetch(launch: Launch, index: int) -> list[str]:
    prefetch = {"prefetch": 2 * launch.parallelism}
    return _dispatcher(replace(launch, binding={**launch.binding, **prefetch}), index)


def _dispatcher_store_prefetch(launch: Launch, index: int) -> list[str]:
    """The store, and room in prefetch for the claim's round trip (issue 44: does the
    store cost CPU, or a round of waiting for each event?)."""
    prefetch = {"prefetch": 2 * launch.parallelism}
    return _dispatcher_store(replace(launch, binding={**launch.binding, **prefetch}), index)


def _dispatcher_traced(ratio: float) -> Callable[[Launch, int], list[str]]:
    """Tracing on, exporting to the subscriber's nginx (``/v1/traces`` answers 200):
    ``ratio`` 1 samples every message, 0 none (every one pays the decision only)."""

    def argv(launch: Launch, index: int) -> list[str]:
        endpoint = launch.subscriber.rstrip("/")
        tracing = {"enabled": True, "endpoint": endpoint, "sample_ratio": ratio}
        config = dispatcher_config(launch, index, {"tracing": tracing})
        return [PYTHON, "-m", "dispatcher", "run", "--config", str(config)]

    return argv


def _pika_httpx(launch: Launch, _index: int) -> list[str]:
    script = str(SCRIPTS / "pika_httpx.py")
    return [
        PYTHON,
        script,
        "--url",
        URL,
        "--queue",
        launch.queue,
        "--subscriber",
        launch.subscriber,
    ]


def _aiopika_aiohttp(launch: Launch, _index: int) -> list[str]:
    script = str(SCRIPTS / "aiopika_aiohttp.py")
    target = ["--queue", launch.queue, "--subscriber", launch.subscriber]
    return [PYTHON, script, "--url", URL, *target, "--parallelism", str(launch.parallelism)]


def _pika_autoack(launch: Launch, _index: int) -> list[str]:
    script = str(SCRIPTS / "pika_autoack.py")
    return [PYTHON, script, "--url", URL, "--queue", launch.queue, "--log", str(launch.receipt_log)]


def _go_peer(launch: Launch, _index: int) -> list[str]:
    return go_peer.argv(URL, launch.queue, launch.subscriber, launch.parallelism)


def _http_only(script: str) -> Callable[[Launch, int], list[str]]:
    def argv(launch: Launch, _index: int) -> list[str]:
        target = ["--subscriber", launch.subscriber, "--ids", str(launch.ids_file)]
        return [PYTHON, str(SCRIPTS / script), *target, "--concurrency", str(launch.parallelism)]

    return argv


@dataclass(frozen=True, slots=True)
class Contender:
    key: str  # what --contenders selects
    label: str  # the table's first column
    argv: Callable[[Launch, int], list[str]]
    consumes: bool = True  # False: posts straight to the subscriber, no broker
    self_logging: bool = False  # writes its own receipt log (no subscriber involved)
    processes: int = 1

    def commands(self, launch: Launch) -> list[list[str]]:
        return [self.argv(launch, index) for index in range(self.processes)]


DISPATCHER: Final = Contender("dispatcher", "dispatcher run", _dispatcher)
DISPATCHER_FILTERED: Final = Contender(
    "dispatcher-filtered", "dispatcher run, 5-entry filter (passes all)", _dispatcher_filtered
)
DISPATCHER_CESQL: Final = Contender(
    "dispatcher-cesql", "dispatcher run, 5-predicate CESQL filter (passes all)", _dispatcher_cesql
)
DISPATCHER_STORE: Final = Contender(
    "dispatcher-store", "dispatcher run, dedupe store in Redis", _dispatcher_store
)
DISPATCHER_PREFETCH: Final = Contender(
    "dispatcher-prefetch", "dispatcher run, prefetch 2x parallelism", _dispatcher_prefetch
)
DISPATCHER_STORE_PREFETCH: Final = Contender(
    "dispatcher-store-prefetch",
    "dispatcher run, dedupe store, prefetch 2x parallelism",
    _dispatcher_store_prefetch,
)
DISPATCHER_TRACED: Final = Contender(
    "dispatcher-traced", "dispatcher run, tracing, every message sampled", _dispatcher_traced(1.0)
)
DISPATCHER_UNSAMPLED: Final = Contender(
    "dispatcher-unsampled", "dispatcher run, tracing, no message sampled", _dispatcher_traced(0.0)
)
DISPATCHER_X2: Final = Contender("dispatcher", "dispatcher run x2", _dispatcher, processes=2)
PIKA_HTTPX: Final = Contender("a", "(a) pika + httpx.Client, sequential", _pika_httpx)
AIOPIKA_AIOHTTP: Final = Contender("b", "(b) aio-pika + aiohttp, tasks", _aiopika_aiohttp)
GO_PEER: Final = Contender(
    "c", "(c) Go, Knative's dispatcher design (amqp091-go, net/http)", _go_peer
)
PIKA_AUTOACK: Final = Contender(
    "pika-autoack", "ceiling: pika auto-ack, no HTTP", _pika_autoack, self_logging=True
)
HTTP_AIOHTTP: Final = Contender(
    "aiohttp", "ceiling: aiohttp alone, no broker", _http_only("http_aiohttp.py"), consumes=False
)
HTTP_HTTPX_THREADS: Final = Contender(
    "httpx-threads",
    "ceiling: httpx.Client shared by N threads, no broker",
    _http_only("http_httpx_threads.py"),
    consumes=False,
)
KEYS: Final = (
    "dispatcher",
    "dispatcher-filtered",
    "dispatcher-cesql",
    "dispatcher-store",
    "dispatcher-prefetch",
    "dispatcher-store-prefetch",
    "dispatcher-traced",
    "dispatcher-unsampled",
    "a",
    "b",
    "c",
    "pika-autoack",
    "aiohttp",
    "httpx-threads",
)
