"""One run: one contender, one workload, a fresh subscriber and a fresh queue.

1. Start the subscriber; declare a queue named after the run; pre-load the
   events (or, for a steady workload, wait for the contender's consumers and
   publish at the workload's rate from a process of its own).
2. Start the contender's process(es) and tail the receipt log every 10 ms:
   CPU of the contender's process tree is read when the first event arrives
   and when the last distinct id has arrived; RSS every 0.5 s (written to the
   run directory as rss.csv); VmHWM at the end.
3. Let acks settle, stop the contender with SIGTERM (it must exit 0), count
   what is left in the queue, delete the queue, read the whole receipt log.
4. From the log, never from the contender: msg/s = distinct events / (last
   first-receipt - first receipt + subscriber delay), duplicates, missing and
   unexpected ids, publish-to-receipt latency. A run that lost, duplicated
   (unless the workload only counts them) or left events raises BenchError.
"""

from __future__ import annotations

import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.bench import payload, queues
from tests.bench.harness import (
    CHILDREN,
    PYTHON,
    ROOT,
    BenchError,
    tail,
    tree_cpu,
    tree_memory,
    tree_threads,
)
from tests.bench.lineup import Contender, Launch
from tests.bench.sinks import Receipt, ReceiptLog, Sink, start_asyncio, start_nginx

POLL: Final = 0.01
RSS_EVERY: Final = 0.5
STALL: Final = 60.0  # seconds without a new event before a run is declared broken
SETTLE: Final = 0.5  # after the last receipt, for the last acks to reach the broker


@dataclass(frozen=True, slots=True)
class Plan:
    """How one run goes."""

    workload: str
    contender: Contender
    events: int
    parallelism: int
    sink: str  # "nginx" | "asyncio"
    delay: float = 0.0  # subscriber delay per request (s)
    rate: float | None = None  # steady publishing (msg/s); None: pre-loaded backlog
    allow_duplicates: bool = False  # count them instead of failing the run
    status: int = 202  # what the asyncio subscriber answers
    dead_letter: bool = False  # a dead-letter exchange and queue; every event must land there


@dataclass(slots=True)
class Observed:
    """What the watch loop saw of the contender."""

    cpu_first: float = 0.0
    cpu_last: float = 0.0
    peak_mb: float = 0.0
    peak_threads: int = 0
    rss_samples: list[tuple[float, int, float]] = field(default_factory=list)  # (s, events, MB)


@dataclass(slots=True)
class Result:
    label: str
    events: int
    msg_s: float
    cpu_per_1k: float
    peak_mb: float
    duplicates: int
    missing: int
    left: int | None
    latencies_ms: list[float] | None = None
    rss_by_progress: tuple[float, ...] = ()
    threads: int = 0  # peak, sampled every 0.5 s
    dead_lettered: int | None = None  # messages found in the dead-letter queue

    @property
    def events_per_cpu_s(self) -> float:
        return 1000 / self.cpu_per_1k if self.cpu_per_1k else float("inf")

    def latency(self, q: float) -> float:
        assert self.latencies_ms
        return statistics.quantiles(self.latencies_ms, n=1000, method="inclusive")[
            round(q * 1000) - 1
        ]


def run_once(plan: Plan, workdir: Path) -> Result:
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"bench-{plan.workload.lower()}-{uuid.uuid4().hex[:8]}"
    ids = payload.event_ids(tag, plan.events)
    if plan.sink == "asyncio":
        sink = start_asyncio(workdir, plan.delay, plan.status)
    else:
        sink = start_nginx(workdir)
    try:
        return _run_with_sink(plan, workdir, tag, ids, sink)
    finally:
        sink.stop()


def _run_with_sink(plan: Plan, workdir: Path, tag: str, ids: list[str], sink: Sink) -> Result:
    contender = plan.contender
    queue = tag if contender.consumes else ""
    dead_letters = f"{tag}-dlq" if plan.dead_letter else None
    extra = {"dead_letter": {"exchange": dead_letters}} if dead_letters else {}
    launch = Launch(
        queue, sink.url, plan.parallelism, workdir, workdir / "ids.txt", workdir / "self.log", extra
    )
    launch.ids_file.write_text("\n".join(ids) + "\n")
    log = ReceiptLog(launch.receipt_log) if contender.self_logging else sink.log
    left = dead_lettered = None
    if queue:
        queues.declare(queue)
    if dead_letters:
        queues.declare_fanout(dead_letters)
    try:
        if queue and plan.rate is None:
            queues.preload(queue, ids)
        observed = _run_contender(plan, launch, log)
        if queue:
            left = queues.counts(queue)[0]
        if dead_letters:
            dead_lettered = queues.counts(dead_letters)[0]
    finally:
        if queue:
            queues.delete(queue)
        if dead_letters:
            queues.delete(dead_letters)
    time.sleep(0.2)  # the asyncio subscriber flushes its log every 50 ms
    result = _evaluate(plan, ids, log.receipts(), observed, left)
    if dead_letters and dead_lettered != len(ids):
        raise BenchError(f"{plan.workload}: {dead_lettered} of {len(ids)} dead letters arrived")
    result.dead_lettered = dead_lettered
    return result


def _run_contender(plan: Plan, launch: Launch, log: ReceiptLog) -> Observed:
    outputs = [launch.workdir / f"contender-{i}.log" for i in range(plan.contender.processes)]
    procs = [
        CHILDREN.spawn(argv, output)
        for argv, output in zip(plan.contender.commands(launch), outputs, strict=True)
    ]
    feeder = None
    try:
        if plan.rate is not None:
            queues.wait_for_consumers(launch.queue, len(procs))
            feeder = _start_feeder(launch, plan.rate)
        observed = _watch(plan, procs, outputs, log, feeder)
        _write_rss_trace(observed.rss_samples, launch.workdir / "rss.csv")
        time.sleep(SETTLE)
        if feeder is not None and feeder.wait(30) != 0:
            raise BenchError(f"steady publisher failed:\n{tail(launch.workdir / 'publisher.log')}")
    finally:
        codes = [CHILDREN.stop(proc) for proc in procs]
        if feeder is not None:
            CHILDREN.stop(feeder, grace=5.0)
    for code, output in zip(codes, outputs, strict=True):
        if code != 0:
            raise BenchError(f"{plan.contender.label} exited {code} on SIGTERM:\n{tail(output)}")
    return observed


def _start_feeder(launch: Launch, rate: float) -> subprocess.Popen[bytes]:
    script = str(ROOT / "tests/bench/steady_publisher.py")
    argv = [PYTHON, script, "--queue", launch.queue, "--ids", str(launch.ids_file)]
    return CHILDREN.spawn([*argv, "--rate", str(rate)], launch.workdir / "publisher.log")


def _check_alive(
    plan: Plan,
    procs: list[subprocess.Popen[bytes]],
    outputs: list[Path],
    feeder: subprocess.Popen[bytes] | None,
) -> None:
    for proc, output in zip(procs, outputs, strict=True):
        if proc.poll() is not None:
            raise BenchError(f"{plan.contender.label} died ({proc.returncode}):\n{tail(output)}")
    if feeder is not None and feeder.poll():
        output = outputs[0].parent / "publisher.log"
        raise BenchError(f"steady publisher failed ({feeder.returncode}):\n{tail(output)}")


def _watch(
    plan: Plan,
    procs: list[subprocess.Popen[bytes]],
    outputs: list[Path],
    log: ReceiptLog,
    feeder: subprocess.Popen[bytes] | None,
) -> Observed:
    roots = [proc.pid for proc in procs]
    observed, seen = Observed(), 0
    started = progress_at = next_sample = time.monotonic()
    while True:
        arrived = log.poll()
        now = time.monotonic()
        if arrived and not seen:
            observed.cpu_first = tree_cpu(roots)
        if arrived > seen:
            seen, progress_at = arrived, now
        if now >= next_sample:
            observed.rss_samples.append((now - started, seen, tree_memory(roots)))
            observed.peak_threads = max(observed.peak_threads, tree_threads(roots))
            next_sample = now + RSS_EVERY
        if seen >= plan.events:
            break
        _check_alive(plan, procs, outputs, feeder)
        if now - progress_at > STALL:
            raise BenchError(
                f"{plan.contender.label}: {plan.events - seen} of {plan.events} events "
                f"missing, no progress for {STALL:.0f} s:\n{tail(outputs[0])}"
            )
        time.sleep(POLL)
    observed.cpu_last = tree_cpu(roots)
    observed.peak_mb = tree_memory(roots, "VmHWM")
    observed.rss_samples.append((time.monotonic() - started, seen, tree_memory(roots)))
    return observed


def _rss_by_progress(samples: list[tuple[float, int, float]], events: int) -> tuple[float, ...]:
    """RSS when 25, 50, 75 and 100% of the events had arrived."""
    marks = []
    for fraction in (0.25, 0.5, 0.75, 1.0):
        marks.append(next(mb for _, count, mb in samples if count >= fraction * events))
    return tuple(marks)


def _write_rss_trace(samples: list[tuple[float, int, float]], path: Path) -> None:
    lines = [f"{at:.2f},{count},{mb:.1f}" for at, count, mb in samples]
    path.write_text("seconds,events,rss_mb\n" + "\n".join(lines) + "\n")


def _evaluate(
    plan: Plan, ids: list[str], receipts: list[Receipt], seen: Observed, left: int | None
) -> Result:
    first: dict[str, Receipt] = {}
    for receipt in receipts:
        first.setdefault(receipt.event_id, receipt)
    expected = set(ids)
    duplicates = len(receipts) - len(first)
    missing = len(expected - first.keys())
    unexpected = len(first.keys() - expected)
    problems = [
        f"{missing} events missing" if missing else "",
        f"{unexpected} unexpected ids" if unexpected else "",
        f"{duplicates} duplicates" if duplicates and not plan.allow_duplicates else "",
        f"{left} events left in the queue" if left else "",
    ]
    if any(problems):
        found = ", ".join(p for p in problems if p)
        raise BenchError(f"{plan.workload} {plan.contender.label}: {found}")
    times = [first[event_id].at for event_id in ids]
    span = max(times) - min(times) + plan.delay
    latencies = None
    if plan.rate is not None:
        latencies = [
            (first[i].at - published) * 1000
            for i in ids
            if (published := first[i].published) is not None
        ]
    return Result(
        label=plan.contender.label,
        events=len(ids),
        msg_s=len(ids) / span,
        cpu_per_1k=(seen.cpu_last - seen.cpu_first) / len(ids) * 1000,
        peak_mb=seen.peak_mb,
        duplicates=duplicates,
        missing=missing,
        left=left,
        latencies_ms=latencies,
        rss_by_progress=_rss_by_progress(seen.rss_samples, len(ids)),
        threads=max(seen.peak_threads, 1),
    )
