"""`make bench`: delivered msg/s of `dispatcher run` on one binding.

W1 of the benchmark plan: a fast local subscriber (202 at once), N persistent
1 KB CloudEvents pre-loaded, parallelism 50. Repeated R times; prints a
Markdown table with the median and min-max. Checks, not assumes, that every
event arrived once and the queue was left empty.

    python tests/bench/run.py [--events 20000] [--parallelism 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parents[2]
URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def preload(queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    body = json.dumps({"pad": "x" * 1000}).encode()[:1024]
    for i in range(count):
        channel.basic_publish(
            "",
            queue,
            body,
            pika.BasicProperties(
                headers={
                    "ce-specversion": "1.0",
                    "ce-id": f"bench-{i}",
                    "ce-source": "/bench",
                    "ce-type": "dev.dispatcher.bench",
                },
                content_type="application/json",
                delivery_mode=2,
            ),
        )
    connection.close()


def stats(port: int) -> tuple[int, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as response:
        received, duplicates = response.read().split()
    return int(received), int(duplicates)


def cpu_and_rss(pid: int) -> tuple[float, int]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
    hwm = next(
        line
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmHWM")
    )
    return cpu, int(hwm.split()[1]) // 1024


def queue_left(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def one_run(events: int, parallelism: int) -> dict[str, float]:
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    subscriber = subprocess.Popen(
        [sys.executable, str(ROOT / "tests/bench/fast_subscriber.py")],
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(subscriber.stdout.readline())  # type: ignore[union-attr]
    preload(queue, events)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "bench.yaml"
        config.write_text(
            json.dumps(
                {
                    "broker": {"url": URL},
                    "http": {"listen": "127.0.0.1:0"},
                    "bindings": [
                        {
                            "name": "bench",
                            "queue": queue,
                            "subscriber": f"http://127.0.0.1:{port}/",
                            "parallelism": parallelism,
                        }
                    ],
                }
            )
        )
        log = open(Path(tmp) / "log.jsonl", "w")  # noqa: SIM115
        started = time.monotonic()
        service = subprocess.Popen(
            [sys.executable, "-m", "dispatcher", "run", "--config", str(config)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            first = None
            while True:
                received, duplicates = stats(port)
                if received and first is None:
                    first = time.monotonic()
                if received >= events:
                    break
                if time.monotonic() - started > 600:
                    raise SystemExit(f"bench: only {received}/{events} delivered in 600 s")
                time.sleep(0.02)
            elapsed = time.monotonic() - (first or started)
            cpu, rss = cpu_and_rss(service.pid)
        finally:
            service.terminate()
            service.wait(30)
            log.close()
            subscriber.terminate()
    left = queue_left(queue)
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    connection.channel().queue_delete(queue)
    connection.close()
    return {
        "msg_s": events / elapsed,
        "cpu_per_1k": cpu / events * 1000,
        "rss_mb": rss,
        "duplicates": duplicates,
        "missing": events - (received - duplicates),
        "left": left,
    }


def summary(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--parallelism", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = [one_run(args.events, args.parallelism) for _ in range(args.repeat)]
    print(
        f"\nW1: {args.events} persistent 1 KB events, parallelism {args.parallelism}, "
        f"fast local subscriber, {args.repeat} runs (median, min-max)\n"
    )
    print(
        "| contender | msg/s | CPU s / 1k events | peak RSS MB "
        "| duplicates | missing | left in queue |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| dispatcher run | {summary([r['msg_s'] for r in runs], '.0f')} "
        f"| {summary([r['cpu_per_1k'] for r in runs], '.3f')} "
        f"| {summary([r['rss_mb'] for r in runs], '.0f')} "
        f"| {sum(r['duplicates'] for r in runs):.0f} | {sum(r['missing'] for r in runs):.0f} "
        f"| {sum(r['left'] for r in runs):.0f} |"
    )


if __name__ == "__main__":
    main()
