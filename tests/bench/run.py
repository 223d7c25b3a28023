"""`make bench` (service side): `dispatcher run` against reference consumers, W1-W7.

Method. Every contender is a process of its own, started fresh for every run
against a fresh queue and a fresh subscriber on this machine (whose CPUs the
broker, subscriber and contender share):

- ``dispatcher run --config <generated yaml>``, one binding, as users run it;
- (a) pika BlockingConnection + synchronous httpx.Client, one message at a time;
- (b) aio-pika + aiohttp, one asyncio task per message;
- ceilings: pika with auto-ack and no HTTP (what one pika consumer can take
  off the queue), and the HTTP client alone against the same subscriber
  (aiohttp at the workload's concurrency; one httpx.Client shared by as many
  threads).

Events are persistent binary-mode CloudEvents with 1,024 bytes of JSON data.
Subscribers are nginx (W1, W4, W5: ``return 202``) or an asyncio server (W2,
W3: optional delay, microsecond timestamps); both log every receipt, and all
figures come from those logs and /proc, never from the contenders:

- msg/s: distinct events / (last first-receipt - first receipt + the
  subscriber's delay), so W3's ideal is exactly 1,000;
- CPU s / 1k events: utime+stime of the contender's process tree between the
  first and the last receipt; events / CPU s is its inverse;
- peak RSS: VmHWM summed over the tree; W4 also samples VmRSS every 0.5 s;
- duplicates, missing and unexpected ids against the published ids, and the
  messages left in the queue once the contender has stopped (SIGTERM; it must
  exit 0). Any of these fails the workload (exit 1, no table), except W5's
  duplicates, which are counted;
- W2 latency: subscriber receipt time minus the publish time the bench put in
  the ``ce-benchpublished`` extension, p50 and p99 over all events.

Repetitions are interleaved (A B C A B C); tables show the median and min-max.
Tables go to stdout and to ``.bench/latest.md``; run directories (configs,
logs) to ``.bench/work/``.

    python tests/bench/run.py [--workloads W1,W3] [--contenders dispatcher,b]
                              [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench import go_peer, queues, report
from tests.bench.harness import CHILDREN, ROOT, BenchError
from tests.bench.lineup import KEYS
from tests.bench.sinks import NGINX_HELP, nginx_available
from tests.bench.workloads import Workload, catalogue, run_workload

OUT = ROOT / ".bench"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3,W4,W5,W6,W7", help="comma-separated")
    parser.add_argument("--contenders", default=",".join(KEYS), help=f"from {','.join(KEYS)}")
    parser.add_argument("--repeat", type=int, help="runs per contender (default: W1/W5 3, else 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, one run: a smoke test")
    args = parser.parse_args(argv)
    args.workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    args.contenders = {c.strip() for c in args.contenders.split(",") if c.strip()}
    unknown = [w for w in args.workloads if w not in catalogue(False)]
    unknown += sorted(args.contenders - set(KEYS))
    if unknown:
        parser.error(f"unknown workloads or contenders: {', '.join(unknown)}")
    return args


def selected(args: argparse.Namespace) -> list[Workload]:
    workloads = catalogue(args.quick)
    chosen = [workloads[key].select(args.contenders, args.repeat) for key in args.workloads]
    return [w for w in chosen if w.contenders]


def nginx_version() -> str:
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    done = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    return done.stderr.strip().replace("nginx version: ", "") or "nginx ?"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_suite(workloads: list[Workload], sections: list[str]) -> None:
    work = OUT / "work"
    shutil.rmtree(work, ignore_errors=True)
    everything: report.Results = {}
    alone: float | None = None
    for workload in workloads:
        results = run_workload(workload, work, say)
        everything[workload.key] = results
        section = report.table(workload, results)
        if workload.key == "W7":
            # W7's yardstick, measured in the same run: what the broker confirms to our
            # own publisher alone with as many publishes in flight as W7 has deliveries.
            alone = queues.publisher_alone(workload.events, workload.parallelism)
            section += (
                f"\nOur publisher alone (`ConfirmedPublisher`, {workload.parallelism} in "
                f"flight, persistent 1 KB events, durable queue): {alone:,.0f} confirms/s.\n"
            )
        sections.append(section)
        print(section, flush=True)
    summary = report.targets(everything, alone) + "\n" + report.store_targets(everything)
    sections.append(summary)
    print(summary, flush=True)


def lock_or_exit() -> IO[str]:
    """One bench at a time: two would measure each other (and share .bench/work)."""
    OUT.mkdir(exist_ok=True)
    lock = open(OUT / "run.lock", "a+")  # noqa: SIM115 (held until the process exits)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "?"
        raise SystemExit(
            f"bench: another tests/bench/run.py is running (pid {holder}); two at once on "
            "this machine would measure each other. Wait for it, or stop it."
        ) from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def write_latest(sections: list[str]) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / "latest.md").write_text("\n".join(sections))


def on_sigterm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = selected(args)
    if any(w.needs_nginx for w in workloads) and not nginx_available():
        say(NGINX_HELP)
        return 2
    if any(c.key == "c" for w in workloads for c in w.contenders):
        try:
            go_peer.build()
        except BenchError as error:
            say(str(error))
            return 2
    lock = lock_or_exit()
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with it ignored
    started = time.monotonic()
    sections = [report.header(queues.broker_version(), nginx_version()) + "\n"]
    print(sections[0], flush=True)
    status = 0
    try:
        run_suite(workloads, sections)
    except BenchError as e:
        say(f"\nbench: FAILED, no figures reported for this workload: {e}")
        sections.append(f"**FAILED**: {e}\n")
        status = 1
    except KeyboardInterrupt:
        say("\nbench: interrupted; .bench/latest.md left as it was")
        status = 130
    finally:
        CHILDREN.kill_all()
        queues.delete_all()
    elapsed = f"Whole run: {(time.monotonic() - started) / 60:.1f} min."
    print(elapsed, flush=True)
    if status != 130:
        write_latest([*sections, elapsed + "\n"])
        say(f"bench: tables written to {OUT / 'latest.md'}")
    lock.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
