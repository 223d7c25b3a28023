"""One `dispatcher run` on a W1-like load: msg/s and the process's CPU per event.

A quick before/after tool for changes to the delivery path (issue 22 used it):
N events pre-loaded, nginx answering 202 at once, one binding at the given
parallelism; the CPU is the process's own (``/proc/<pid>/stat``) when its
last delivery line is out, so the figure has no broker or subscriber in it.
Start-up is left out of the CPU (it is taken when the consumer is attached),
and each thread's share is printed. ``--sample-ratio`` turns tracing on, ``--store``
the shared dedupe store.
``--checkout`` runs another tree's code (a worktree of an older commit) against
the same broker and nginx, so two commits compare in one sitting:

    python tests/bench/cpu_per_event.py --checkout /work/base
    python tests/bench/cpu_per_event.py

To see where the time goes, run the same command under py-spy
(``py-spy record -f raw -o loop.raw -- python -m dispatcher run ...``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import payload, queues  # noqa: E402
from tests.bench.harness import PYTHON  # noqa: E402
from tests.bench.queues import URL  # noqa: E402
from tests.bench.sinks import start_nginx  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--parallelism", type=int, default=50)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="whose dispatcher to run")
    parser.add_argument(
        "--sample-ratio",
        type=float,
        help="tracing on, spans to nginx (/v1/traces answers 200), this share sampled",
    )
    parser.add_argument(
        "--store", help="a shared dedupe store (dedupe.store), e.g. redis://127.0.0.1:6379/0"
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="run the service under py-spy, its samples (raw, per thread) to FILE",
    )
    args = parser.parse_args()
    work = ROOT / ".bench" / "cpu-per-event"
    work.mkdir(parents=True, exist_ok=True)
    sink = start_nginx(work)
    queue = f"bench-cpu-{os.getpid()}"
    out = work / "dispatcher.log"
    try:
        queues.declare(queue)
        # Ids of this run's own: a store that knew them would answer "settled".
        queues.preload(queue, payload.event_ids(queue, args.events))
        config = {
            "broker": {"url": URL},
            "http": {"listen": "127.0.0.1:0"},
            "bindings": [
                {
                    "name": "bench",
                    "queue": queue,
                    "subscriber": sink.url,
                    "parallelism": args.parallelism,
                    "delivery": {"retry": 5, "timeout": "10s"},
                }
            ],
        }
        if args.store is not None:
            config["dedupe"] = {"store": args.store}
        if args.sample_ratio is not None:
            endpoint = sink.url.rstrip("/")
            config["tracing"] = {
                "enabled": True,
                "endpoint": endpoint,
                "sample_ratio": args.sample_ratio,
            }
        (work / "dispatcher.yaml").write_text(yaml.safe_dump(config))
        started = time.monotonic()
        with out.open("w") as log:
            command = [PYTHON, "-m", "dispatcher", "run", "--config", str(work / "dispatcher.yaml")]
            if args.py_spy is not None:
                spy = [str(Path(PYTHON).with_name("py-spy")), "record", "--threads", "--gil"]
                out_file = str(args.py_spy.resolve())
                command = [*spy, "-r", "500", "-f", "raw", "-o", out_file, "--", *command]
            proc = subprocess.Popen(
                command,
                cwd=args.checkout,
                env={**os.environ, "PYTHONPATH": str(args.checkout)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            at_start = _when(proc, out, lambda text: "consumer attached" in text)
            _when(proc, out, lambda text: text.count('"outcome": "delivered"') >= args.events)
            elapsed = time.monotonic() - started
            at_end = _threads(_service(proc.pid))
        finally:
            proc.send_signal(2)
            proc.wait(30)
    finally:
        queues.delete(queue)
        sink.stop()
    # Start-up (imports, settings, connecting) is left out: it is paid once.
    used = {tid: cpu - at_start.get(tid, 0.0) for tid, cpu in at_end.items()}
    cpu = sum(used.values())
    print(
        f"{args.checkout}: {args.events} events, parallelism {args.parallelism}: "
        f"{args.events / elapsed:,.0f} msg/s (start included), "
        f"{1000 * cpu / args.events:.3f} ms CPU per event after start-up"
    )
    busy = (f"{1000 * cpu / args.events:.3f}" for _tid, cpu in sorted(used.items()) if cpu)
    print("  per thread (by thread id), ms per event: " + ", ".join(busy))
    return 0


def _when(
    proc: subprocess.Popen[bytes], out: Path, done: Callable[[str], bool]
) -> dict[int, float]:
    """The process's threads' CPU once ``done`` holds for its output so far."""
    while not done(out.read_text()):
        if proc.poll() is not None:
            raise SystemExit(f"dispatcher exited early:\n{out.read_text()[-2000:]}")
        time.sleep(0.05)
    return _threads(_service(proc.pid))


def _service(pid: int) -> int:
    """The service's own process: ``pid``, or under py-spy its child."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(children[0]) if children else pid


def _threads(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each of a process's threads, by thread id."""
    used = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        used[int(task.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return used


if __name__ == "__main__":
    sys.exit(main())
