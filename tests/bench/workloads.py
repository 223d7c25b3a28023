"""W1-W7 (issues 7 and 11): what each runs, against whom, how often.

| | events | parallelism | subscriber | contenders |
|---|---|---|---|---|
| W1 | 20k pre-loaded | 50 | nginx, 202 at once | all six; ours + filter, store, prefetch, tracing |
| W2 | 1,000 msg/s for 30 s | 50 | asyncio, 202 at once | ours (+store), (a), (b), (c), pika |
| W3 | 5k pre-loaded ((a): 200) | 100 | asyncio, 202 after 100 ms | consumers + HTTP ceilings |
| W4 | 200k pre-loaded ((a): 20k) | 100 | nginx | dispatcher, (b), (a) |
| W5 | 20k pre-loaded | 50 per process | nginx | dispatcher x1 vs x2 |
| W6 | 20k pre-loaded | 2,000 | asyncio, 202 after 2 s | dispatcher, (b) |
| W7 | 20k pre-loaded | 50 | asyncio, 400 at once | dispatcher (dead-letter exchange) |

Repetitions are interleaved: run 1 of every contender, then run 2, and so on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.bench.lineup import (
    AIOPIKA_AIOHTTP,
    DISPATCHER,
    DISPATCHER_CESQL,
    DISPATCHER_FILTERED,
    DISPATCHER_PREFETCH,
    DISPATCHER_STORE,
    DISPATCHER_STORE_PREFETCH,
    DISPATCHER_TRACED,
    DISPATCHER_UNSAMPLED,
    DISPATCHER_X2,
    GO_PEER,
    HTTP_AIOHTTP,
    HTTP_HTTPX_THREADS,
    PIKA_AUTOACK,
    PIKA_HTTPX,
    Contender,
)
from tests.bench.runner import Plan, Result, run_once


@dataclass(frozen=True, slots=True)
class Workload:
    key: str
    title: str
    contenders: tuple[Contender, ...]
    events: int
    parallelism: int
    sink: str
    repeat: int
    delay: float = 0.0
    rate: float | None = None
    fewer_events: Mapping[str, int] = field(default_factory=dict)  # contender key -> events
    allow_duplicates: bool = False
    status: int = 202  # the asyncio subscriber's answer
    dead_letter: bool = False  # the dispatcher dead-letters to an exchange; all must land
    note: str = ""  # printed under the table

    @property
    def needs_nginx(self) -> bool:
        return self.sink == "nginx"

    def plan(self, contender: Contender) -> Plan:
        return Plan(
            workload=self.key,
            contender=contender,
            events=self.fewer_events.get(contender.key, self.events),
            parallelism=self.parallelism,
            sink=self.sink,
            delay=self.delay,
            rate=self.rate,
            allow_duplicates=self.allow_duplicates,
            status=self.status,
            dead_letter=self.dead_letter,
        )

    def select(self, keys: set[str], repeat: int | None) -> Workload:
        chosen = tuple(c for c in self.contenders if c.key in keys)
        return replace(self, contenders=chosen, repeat=repeat or self.repeat)


def catalogue(quick: bool) -> dict[str, Workload]:
    """The seven workloads; ``quick`` shrinks every size for a smoke run."""

    def size(full: int, smoke: int) -> int:
        return smoke if quick else full

    steady_seconds = size(30, 5)
    lineup = (
        DISPATCHER,
        PIKA_HTTPX,
        AIOPIKA_AIOHTTP,
        GO_PEER,
        PIKA_AUTOACK,
        HTTP_AIOHTTP,
        HTTP_HTTPX_THREADS,
    )
    w1 = Workload(
        "W1",
        "fast subscriber (nginx, 202 at once), persistent 1 KB events pre-loaded",
        (
            DISPATCHER,
            DISPATCHER_FILTERED,
            DISPATCHER_CESQL,
            DISPATCHER_STORE,
            DISPATCHER_PREFETCH,
            DISPATCHER_STORE_PREFETCH,
            DISPATCHER_TRACED,
            DISPATCHER_UNSAMPLED,
            *lineup[1:],
        ),
        events=size(20_000, 2_000),
        parallelism=50,
        sink="nginx",
        repeat=size(3, 1),
        note="The filtered dispatcher passes every event through a 5-entry filter "
        "(tests/bench/lineup.py); the store row claims and settles every event in the "
        "Redis at 127.0.0.1:6379 (dedupe.store); the traced rows export spans over OTLP/HTTP to "
        "nginx (every message sampled, or none). Ceilings: pika auto-ack is its own subscriber "
        "(receipt = delivery to the consumer); the HTTP ceilings post straight to nginx, "
        "50 at a time (aiohttp tasks; 50 threads sharing one httpx.Client).",
    )
    w2 = Workload(
        "W2",
        f"steady publishing at 1,000 msg/s for {steady_seconds} s, asyncio subscriber "
        "(202 at once); latency = publish to subscriber receipt",
        (DISPATCHER, DISPATCHER_STORE, PIKA_HTTPX, AIOPIKA_AIOHTTP, GO_PEER, PIKA_AUTOACK),
        events=1_000 * steady_seconds,
        parallelism=50,
        sink="asyncio",
        repeat=1,
        rate=1_000.0,
        note="Latency includes the broker hop: the pika auto-ack row (receipt at the consumer, "
        "no HTTP) is that floor. The publisher is a process of its own: plain basic_publish "
        "on a fixed schedule.",
    )
    w3 = Workload(
        "W3",
        "slow subscriber (asyncio, 202 after 100 ms), events pre-loaded; ideal 1,000 msg/s",
        (
            DISPATCHER,
            DISPATCHER_PREFETCH,
            PIKA_HTTPX,
            AIOPIKA_AIOHTTP,
            GO_PEER,
            HTTP_AIOHTTP,
            HTTP_HTTPX_THREADS,
        ),
        events=size(5_000, 1_000),
        parallelism=100,
        sink="asyncio",
        repeat=1,
        delay=0.1,
        fewer_events={"a": size(200, 30)},
        note="(a) is sequential (10 msg/s at best here), so it gets fewer events. msg/s "
        "includes the last event's 100 ms; the HTTP ceilings use 100 tasks / 100 threads.",
    )
    w4 = Workload(
        "W4",
        "memory: backlog pre-loaded, nginx subscriber; RSS sampled every 0.5 s",
        (DISPATCHER, AIOPIKA_AIOHTTP, GO_PEER, PIKA_HTTPX),
        events=size(200_000, 20_000),
        parallelism=100,
        sink="nginx",
        repeat=1,
        fewer_events={"a": size(20_000, 5_000)},
        note="(a) gets fewer events (sequential; its memory is bounded by prefetch 50). "
        "Flat after 50%: RSS at 75% and 100% of the events within 5% of RSS at 50% (the "
        "first half may fill bounded memory, e.g. the dispatcher's dedupe window of "
        "100,000 events). Per-run RSS traces: .bench/work/W4-*/rss.csv.",
    )
    w5 = Workload(
        "W5",
        "one vs two `dispatcher run` processes on one queue, nginx subscriber",
        (DISPATCHER, DISPATCHER_X2),
        events=size(20_000, 4_000),
        parallelism=50,
        sink="nginx",
        repeat=size(3, 1),
        allow_duplicates=True,
        note="Parallelism 50 per process; here duplicates are counted, not fatal.",
    )
    w6 = Workload(
        "W6",
        "many slow deliveries (asyncio, 202 after 2 s), events pre-loaded; ideal 1,000 msg/s",
        (DISPATCHER, DISPATCHER_PREFETCH, AIOPIKA_AIOHTTP, GO_PEER),
        events=size(20_000, 4_000),
        parallelism=2000,
        sink="asyncio",
        repeat=1,
        delay=2.0,
        note="2,000 deliveries in flight at a time. Threads: the contender's peak, sampled "
        "every 0.5 s. msg/s includes the last event's 2 s.",
    )
    w7 = Workload(
        "W7",
        "dead-letter storm: the subscriber answers 400 to everything, "
        "`dead_letter.exchange` set; events pre-loaded",
        (DISPATCHER, DISPATCHER_PREFETCH),
        events=size(20_000, 2_000),
        parallelism=50,
        sink="asyncio",
        repeat=size(3, 1),
        status=400,
        dead_letter=True,
        note="msg/s here is dead letters per second: each event is refused once (400 is not "
        "retried), published to the dead-letter exchange and acked after its confirm; every "
        "one must be in the dead-letter queue and none left in the source queue.",
    )
    return {w.key: w for w in (w1, w2, w3, w4, w5, w6, w7)}


def run_workload(
    workload: Workload, workdir: Path, progress: Callable[[str], None]
) -> dict[str, list[Result]]:
    """Every contender ``repeat`` times, interleaved; results by contender label."""
    results: dict[str, list[Result]] = {c.label: [] for c in workload.contenders}
    for rep in range(1, workload.repeat + 1):
        for index, contender in enumerate(workload.contenders):
            plan = workload.plan(contender)
            progress(f"{workload.key} run {rep}/{workload.repeat}: {contender.label} ...")
            result = run_once(plan, workdir / f"{workload.key}-r{rep}-c{index}")
            progress(
                f"  {result.msg_s:,.0f} msg/s, {result.cpu_per_1k:.3f} CPU s/1k, "
                f"{result.peak_mb:.0f} MB"
            )
            results[contender.label].append(result)
    return results
