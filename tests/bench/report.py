"""Markdown for the results: a header line about the machine, one table per workload.

Figures are medians over the repetitions, with min-max in parentheses when
there was more than one; duplicates, missing and left-in-queue are totals.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Callable
from typing import Final

from tests.bench.harness import ROOT
from tests.bench.runner import Result
from tests.bench.workloads import Workload

# Flat: RSS may grow this much from the 50% mark to the end. Measured from half-way, not
# from the start, so that bounded warm-up (the dispatcher's dedupe memory fills up to
# 100,000 events) does not count as growth; the four marks are printed beside it.
FLAT_GROWTH: Final = 0.05

Column = tuple[str, Callable[[list[Result]], str]]


def stat(values: list[float], fmt: str) -> str:
    median = f"{statistics.median(values):{fmt}}"
    if len(values) == 1:
        return median
    return f"{median} ({min(values):{fmt}}-{max(values):{fmt}})"


def _git() -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "?"
    return commit + (" + uncommitted changes" if git("status", "--porcelain") else "")


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo").read().splitlines():  # noqa: SIM115
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def header(broker_version: str, nginx_version: str) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Machine: {os.cpu_count()} CPUs ({_cpu_model()}), shared by broker, subscriber "
        f"and contender · RabbitMQ {broker_version} · Python {platform.python_version()} · "
        f"{nginx_version} · {now} · commit {_git()}"
    )


def _total(pick: Callable[[Result], int | None]) -> Callable[[list[Result]], str]:
    def cell(results: list[Result]) -> str:
        values = [pick(r) for r in results]
        return "n/a" if None in values else f"{sum(v or 0 for v in values):,}"

    return cell


def _median_marks(results: list[Result]) -> list[float]:
    return [statistics.median(r.rss_by_progress[i] for r in results) for i in range(4)]


def _flat(results: list[Result]) -> str:
    marks = _median_marks(results)
    growth = max(marks[2:]) / marks[1] - 1 if marks[1] else 0.0
    return f"{'yes' if growth <= FLAT_GROWTH else 'no'} ({growth:+.1%})"


def _rss_marks(results: list[Result]) -> str:
    return " / ".join(f"{mb:.0f}" for mb in _median_marks(results))


def columns(workload: Workload) -> list[Column]:
    ideal = workload.parallelism / workload.delay if workload.delay else 0.0
    base: list[Column] = [
        ("contender", lambda rs: rs[0].label),
        ("events", lambda rs: f"{rs[0].events:,}"),
        ("msg/s", lambda rs: stat([r.msg_s for r in rs], ",.0f")),
    ]
    extra: dict[str, list[Column]] = {
        "W2": [
            ("p50 ms", lambda rs: stat([r.latency(0.5) for r in rs], ".1f")),
            ("p99 ms", lambda rs: stat([r.latency(0.99) for r in rs], ".1f")),
        ],
        "W3": [("% of ideal", lambda rs: stat([r.msg_s / ideal * 100 for r in rs], ".1f"))],
        "W6": [("% of ideal", lambda rs: stat([r.msg_s / ideal * 100 for r in rs], ".1f"))],
        "W7": [
            ("in dead-letter queue", lambda rs: stat([r.dead_lettered or 0 for r in rs], ",.0f"))
        ],
    }
    cpu: list[Column] = [("CPU s / 1k events", lambda rs: stat([r.cpu_per_1k for r in rs], ".3f"))]
    if workload.key == "W1":
        cpu.append(("events / CPU s", lambda rs: stat([r.events_per_cpu_s for r in rs], ",.0f")))
    memory: list[Column] = [
        ("peak RSS MB", lambda rs: stat([r.peak_mb for r in rs], ".0f")),
        ("threads", lambda rs: stat([r.threads for r in rs], ".0f")),
    ]
    if workload.key == "W4":
        memory += [("RSS MB at 25/50/75/100%", _rss_marks), ("flat after 50%", _flat)]
    checks: list[Column] = [
        ("duplicates", _total(lambda r: r.duplicates)),
        ("missing", _total(lambda r: r.missing)),
        ("left in queue", _total(lambda r: r.left)),
    ]
    return base + extra.get(workload.key, []) + cpu + memory + checks


def _w5_summary(results: dict[str, list[Result]]) -> str:
    runs = list(results.values())
    if len(runs) != 2 or not all(runs):
        return ""
    one, two = (statistics.median(r.msg_s for r in rs) for rs in runs)
    duplicates = sum(r.duplicates for r in runs[1])
    return (
        f"\nTwo processes / one: **{two / one:.2f}x** the throughput (medians); "
        f"duplicates with two processes: **{duplicates}**.\n"
    )


def table(workload: Workload, results: dict[str, list[Result]]) -> str:
    cols = columns(workload)
    reps = f"{workload.repeat} run{'s' if workload.repeat > 1 else ''} each"
    if workload.repeat > 1:
        reps += ", interleaved; median (min-max)"
    lines = [
        f"### {workload.key}: {workload.title}",
        "",
        f"Parallelism {workload.parallelism}; {reps}.",
        "",
        "| " + " | ".join(name for name, _ in cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += [
        "| " + " | ".join(cell(rs) for _, cell in cols) + " |" for rs in results.values() if rs
    ]
    text = "\n".join(lines) + "\n"
    if workload.note:
        text += f"\n{workload.note}\n"
    if workload.key == "W5":
        text += _w5_summary(results)
    return text


# ----------------------------------------------------------------- issue 22's targets

Results = dict[str, dict[str, list[Result]]]  # workload -> contender label -> runs


def _median(results: Results, workload: str, label: str, pick: Callable[[Result], float]) -> float:
    runs = results.get(workload, {}).get(label) or []
    return statistics.median(pick(r) for r in runs) if runs else float("nan")


def targets(results: Results, publisher_alone: float | None = None) -> str:
    """Issue 22's targets against this run's figures (ratios within this one run).
    W3's and W6's ideal is 1,000 msg/s (parallelism / subscriber delay); W7's
    yardstick is ``publisher_alone``, our own publisher's confirms per second
    with as many publishes in flight, measured in the same run."""
    d, b = "dispatcher run", "(b) aio-pika + aiohttp, tasks"
    c = "(c) Go, Knative's dispatcher design (amqp091-go, net/http)"

    def of(workload: str, pick: Callable[[Result], float], label: str = d) -> float:
        return _median(results, workload, label, pick)

    def cpu(r: Result) -> float:
        return r.cpu_per_1k

    def p99(r: Result) -> float:
        return r.latency(0.99)

    alone = publisher_alone or float("nan")
    rows = [
        ("W1 msg/s vs (c)", ">= 0.9x", of("W1", _rate) / of("W1", _rate, c), 0.9, 1),
        ("W1 msg/s vs (b)", ">= 2.3x", of("W1", _rate) / of("W1", _rate, b), 2.3, 1),
        ("W1 CPU s / 1k events vs (c)", "<= 1.4x", of("W1", cpu) / of("W1", cpu, c), 1.4, -1),
        ("W2 p99 vs (c)'s p99", "<= 1.0x", of("W2", p99) / of("W2", p99, c), 1.0, -1),
        ("W3 % of ideal", ">= 98", of("W3", lambda r: r.msg_s / 10), 98.0, 1),
        ("W6 % of ideal", ">= 95", of("W6", lambda r: r.msg_s / 10), 95.0, 1),
        ("W6 threads", "<= 4", of("W6", lambda r: r.threads), 4, -1),
        ("W7 dead letters / s vs our publisher alone", ">= 0.8x", of("W7", _rate) / alone, 0.8, 1),
    ]
    lines = [
        "### Targets (issue 22), this run",
        "",
        "| target | wanted | measured | met |",
        "|---|---|---|---|",
    ]
    for name, wanted, value, bound, sign in rows:
        if math.isnan(value):
            lines.append(f"| {name} | {wanted} | not run | |")
            continue
        met = value >= bound if sign > 0 else value <= bound
        shown = (
            f"{value:,.3f}" if value < 1 else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        )
        lines.append(f"| {name} | {wanted} | {shown} | {'yes' if met else '**no**'} |")
    return "\n".join(lines) + "\n"


def store_targets(results: Results) -> str:
    """Issue 44's: what the shared dedupe store costs, W1 with it against W1 without
    (ratios within this one run), and the latency its claim adds at W2's rate."""
    d, store = "dispatcher run", "dispatcher run, dedupe store in Redis"

    def of(workload: str, pick: Callable[[Result], float], label: str) -> float:
        return _median(results, workload, label, pick)

    rate = of("W1", _rate, store) / of("W1", _rate, d)
    cpu = of("W1", lambda r: r.cpu_per_1k, store) / of("W1", lambda r: r.cpu_per_1k, d)
    lines = [
        "### The shared dedupe store (issue 44), this run",
        "",
        "| target | wanted | measured | met |",
        "|---|---|---|---|",
    ]
    for name, wanted, value, met in (
        ("W1 msg/s with the store vs without", ">= 0.95x", rate, rate >= 0.95),
        ("W1 CPU s / 1k events with the store vs without", "<= 1.10x", cpu, cpu <= 1.10),
    ):
        shown = "not run" if math.isnan(value) else f"{value:,.3f}"
        verdict = "" if math.isnan(value) else "yes" if met else "**no**"
        lines.append(f"| {name} | {wanted} | {shown} | {verdict} |")
    for q in (0.5, 0.99):

        def at(result: Result, q: float = q) -> float:
            return result.latency(q)

        added = of("W2", at, store) - of("W2", at, d)
        shown = "not run" if math.isnan(added) else f"{added:+,.2f} ms"
        lines.append(f"| W2 latency the claim adds, p{round(q * 100)} | reported | {shown} | |")
    return "\n".join(lines) + "\n"


def _rate(result: Result) -> float:
    return result.msg_s
