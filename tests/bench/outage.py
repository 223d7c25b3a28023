"""W8 (issue 24): a subscriber outage at scale, with and without the circuit breaker.

    python tests/bench/outage.py [--events N] [--outage SECONDS]

20,000 persistent events pre-loaded, parallelism 100, the bench's asyncio
subscriber (202 at once), `dead_letter.exchange` set, the delivery defaults
(retry 5, exponential backoff from 200 ms). Once 5,000 events have arrived the
subscriber goes down for 60 s (503 at once to every request, SIGUSR1 to
``fast_subscriber.py``), then comes back. For each run: events dead-lettered
(the dead-letter queue's count), the delay from the subscriber's return to
the first delivery after it (the breaker's probe), and the rate at which the
backlog drains after that, against the same run's rate before the outage.

The breaker's settings follow docs/operations.md's advice: a `window` (2 s) shorter
than the fastest a message can spend its retries (about 5 s here), so it opens
before any message runs out of them; `open_for` 1 s, `max_open` 5 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import queues  # noqa: E402
from tests.bench.harness import CHILDREN, PYTHON, BenchError, tail  # noqa: E402
from tests.bench.queues import URL  # noqa: E402
from tests.bench.sinks import start_asyncio  # noqa: E402

BREAKER: dict[str, Any] = {
    "failure_ratio": 0.5,
    "min_attempts": 20,
    "window": "2s",
    "open_for": "1s",
    "max_open": "5s",
}
OUT = ROOT / ".bench" / "outage"


@dataclass(slots=True)
class Run:
    label: str
    events: int
    dead_lettered: int
    duplicates: int
    rate_before: float  # msg/s from the first receipt to the outage
    probe_delay: float  # s from the subscriber's return to the first receipt after it
    backlog: int  # events not delivered when the subscriber came back
    drain_rate: float  # backlog / (last receipt - first receipt after the return)


def run(label: str, breaker: dict[str, Any] | None, events: int, outage: float) -> Run:
    work = OUT / label.replace(" ", "-")
    work.mkdir(parents=True, exist_ok=True)
    for old in work.iterdir():
        old.unlink()
    tag = f"bench-w8-{os.getpid()}-{int(time.time())}"
    queue, dead = tag, f"{tag}-dlq"
    sink = start_asyncio(work, 0.0)
    queues.declare(queue)
    queues.declare_fanout(dead)
    try:
        queues.preload(queue, [f"e{n}" for n in range(events)])
        binding: dict[str, Any] = {
            "name": "w8",
            "queue": queue,
            "subscriber": sink.url,
            "parallelism": 100,
            "dead_letter": {"exchange": dead},
        }
        if breaker is not None:
            binding["circuit_breaker"] = breaker
        config = {"broker": {"url": URL}, "http": {"listen": "127.0.0.1:0"}, "bindings": [binding]}
        (work / "dispatcher.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        output = work / "dispatcher.log"
        argv = [PYTHON, "-m", "dispatcher", "run", "--config", str(work / "dispatcher.yaml")]
        proc = CHILDREN.spawn(argv, output)
        try:
            down_at, up_at = _drive(sink, proc, output, dead, events, outage)
        finally:
            CHILDREN.stop(proc)
        dead_lettered = queues.counts(dead)[0]
    finally:
        sink.stop()
        queues.delete(queue)
        queues.delete(dead)
    receipts = sink.log.receipts()
    times = sorted(r.at for r in receipts)
    ids = {r.event_id for r in receipts}
    if len(ids) + dead_lettered < events:
        raise BenchError(f"W8 {label}: {events - len(ids) - dead_lettered} events lost")
    before = [t for t in times if t < down_at]
    after = [t for t in times if t >= up_at]
    backlog = events - dead_lettered - len([t for t in times if t < up_at])
    drain = after[-1] - after[0] if len(after) > 1 else float("nan")
    return Run(
        label,
        events,
        dead_lettered,
        len(receipts) - len(ids),
        len(before) / (before[-1] - before[0]),
        after[0] - up_at if after else float("nan"),
        backlog,
        backlog / drain,
    )


def _drive(sink: Any, proc: Any, output: Path, dead: str, events: int, outage: float):
    """Take the subscriber down after a quarter of the events, bring it back after
    ``outage`` s; return both moments (epoch seconds, as the receipt log's)."""
    deadline = time.monotonic() + 120
    while sink.log.poll() < events // 4:
        _alive(proc, output, deadline)
        time.sleep(0.01)
    sink.proc.send_signal(signal.SIGUSR1)
    down_at = time.time()
    time.sleep(outage)  # the scenario's outage, not synchronisation
    sink.proc.send_signal(signal.SIGUSR2)
    up_at = time.time()
    deadline = time.monotonic() + 300
    while sink.log.poll() + queues.counts(dead)[0] < events:
        _alive(proc, output, deadline)
        time.sleep(0.2)
    return down_at, up_at


def _alive(proc: Any, output: Path, deadline: float) -> None:
    if proc.poll() is not None:
        raise BenchError(f"W8: dispatcher exited:\n{tail(output)}")
    if time.monotonic() > deadline:
        raise BenchError(f"W8: no progress:\n{tail(output)}")


def table(runs: list[Run], outage: float) -> str:
    lines = [
        "### W8: a subscriber outage at scale (issue 24)",
        "",
        f"{runs[0].events:,} events pre-loaded, parallelism 100, asyncio subscriber (202), "
        f"down (503) for {outage:.0f} s once a quarter of the events arrived; "
        "`dead_letter.exchange` set; delivery defaults (retry 5, backoff from 200 ms). "
        f"Breaker: `{{{', '.join(f'{k}: {v}' for k, v in BREAKER.items())}}}`.",
        "",
        "| run | dead-lettered | duplicates | msg/s before the outage | first delivery after "
        "the return | backlog | backlog drained at | vs before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r.label} | {r.dead_lettered:,} | {r.duplicates} | {r.rate_before:,.0f} | "
            f"{r.probe_delay:.2f} s | {r.backlog:,} | {r.drain_rate:,.0f} msg/s | "
            f"{r.drain_rate / r.rate_before:.2f}x |"
        )
    last = runs[-1]
    met = last.dead_lettered == 0 and last.drain_rate >= 0.9 * last.rate_before
    lines += [
        "",
        "Target: 0 dead-lettered with the breaker, and the backlog drained at >= 0.9x the "
        f"rate before the outage: **{'met' if met else 'not met'}**.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--outage", type=float, default=60.0)
    args = parser.parse_args()
    runs = [
        run("without the breaker", None, args.events, args.outage),
        run("with the breaker", BREAKER, args.events, args.outage),
    ]
    text = table(runs, args.outage)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "latest.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
