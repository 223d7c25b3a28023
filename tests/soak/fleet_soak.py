"""`make soak`: two `dispatcher run` replicas sharing a dedupe store, under random faults.

What a user running a fleet would try before trusting it: a disposable
RabbitMQ node and redis-server of the soak's own (the machine's shared ones
are never touched), a durable queue with a dead-letter exchange, two replicas
that reach the broker and the store each through fault proxies of their own,
a subscriber in this process, and a publisher with confirms at a steady rate.
The subscriber takes ``--latency`` to answer (50 ms by default, as a real one
does: deliveries are in flight when a fault comes) and refuses one event in
``--refused`` (400: dead-lettered at once, by a confirmed publish to the
binding's dead-letter exchange), so dead letters are in flight whenever a
broker fault comes. For ``--minutes`` a seeded schedule injects
one fault at a time: a replica's
broker connection reset or black-holed, the broker stopped and started, a
server-side close of every connection, the subscriber failing or slow, the
store black-holed (for one replica or both) or restarted empty, a replica
SIGKILLed or SIGTERMed and restarted (always "a": "b" lives through the
whole run, and its resources are compared). Then the faults end, the queue drains,
and the ledger (``tests/soak/ledger.py``) says what was lost and which
duplicates happened in which fault window. Exit 1 when anything was lost or
a duplicate is unexplained.

    python tests/soak/fleet_soak.py [--minutes 20] [--rate 120] [--seed N] [--out DIR]
        [--refused 10] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pika

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.soak.ledger import Fault, Ledger, Request, table
from tests.support.node import RabbitNode
from tests.support.process import DispatcherProcess
from tests.support.proxy import FaultProxy
from tests.support.redis_server import RedisServer

QUEUE, DLX, DLQ = "soak", "soak.dlx", "soak.dlq"
REPLICAS = ("a", "b")


class Fleet:
    """The broker, the store, the proxies, the subscriber and the replicas."""

    def __init__(self, out: Path, ledger: Ledger, refused: int, latency: float) -> None:
        self.out = out
        self.ledger = ledger
        self.refused = refused  # one event in this many is answered 400, in any mode
        self.latency = latency
        self.node = RabbitNode().start()
        self.store = RedisServer().start()
        self.brokers = {name: FaultProxy(self.node.port) for name in REPLICAS}
        self.stores = {name: FaultProxy(self.store.port) for name in REPLICAS}
        self.subscriber_mode = "up"  # up | down (503) | slow
        self._lock = threading.Lock()
        self.subscriber = SoakSubscriber(self._answer)
        self.incarnations = dict.fromkeys(REPLICAS, 0)
        self.replicas: dict[str, DispatcherProcess] = {}
        self._declare()
        for name in REPLICAS:
            self.start_replica(name)

    def _declare(self) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(self.node.url))
        channel = connection.channel()
        channel.exchange_declare(DLX, "fanout", durable=True)
        channel.queue_declare(DLQ, durable=True)
        channel.queue_bind(DLQ, DLX)
        connection.close()

    def _answer(self, event_id: str, replica: str) -> tuple[int, float]:
        mode = self.subscriber_mode
        status = 503 if mode == "down" else 200
        if event_id.startswith("soak-") and int(event_id[5:]) % self.refused == 0:
            status = 400
        with self._lock:
            self.ledger.requests.append(Request(event_id, replica, time.monotonic(), status))
        # Slow, but within the attempt's timeout: a request that timed out and
        # was answered later would be the subscriber's own duplicate.
        return status, 1.0 if mode == "slow" else self.latency

    def config(self, name: str) -> dict[str, Any]:
        return {
            "broker": {
                "url": self.brokers[name].url,
                "heartbeat": "5s",
                "connection_name": f"soak-{name}",
                "reconnect": {"initial_delay": "100ms", "max_delay": "2s"},
            },
            "http": {"listen": "127.0.0.1:0"},
            "shutdown": {"grace": "5s"},
            "logging": {"level": "info", "format": "json"},
            "dedupe": {"store": f"redis://127.0.0.1:{self.stores[name].port}/0"},
            "bindings": [
                {
                    "name": "soak",
                    "queue": QUEUE,
                    "declare": {"durable": True, "dead_letter_exchange": DLX},
                    "subscriber": self.subscriber.url,
                    "parallelism": 20,
                    "headers": {"X-Replica": name},
                    "dedupe_window": "2h",
                    "dead_letter": {"exchange": DLX},
                    "delivery": {
                        "retry": 3,
                        "timeout": "3s",
                        "backoff_delay": "100ms",
                        "backoff_max": "1s",
                    },
                }
            ],
        }

    def start_replica(self, name: str) -> None:
        if name in self.replicas:  # a restart: keep what the one before wrote
            self._save_log(name)
        self.incarnations[name] += 1
        folder = self.out / f"{name}-{self.incarnations[name]}"
        folder.mkdir(parents=True, exist_ok=True)
        process = DispatcherProcess(self.config(name), folder)
        self.replicas[name] = process
        process.wait_for("listening", timeout=60)

    def save_logs(self) -> None:
        for name in self.replicas:
            self._save_log(name)

    def _save_log(self, name: str) -> None:
        path = self.out / f"{name}-{self.incarnations[name]}" / "output.jsonl"
        path.write_text(self.replicas[name].output())

    def resources(self) -> dict[str, dict[str, int]]:
        """Threads, open descriptors and RSS (kB) of each replica never restarted:
        what must stay flat across faults."""
        found = {}
        for name, process in self.replicas.items():
            if self.incarnations[name] != 1 or process.popen.poll() is not None:
                continue
            proc = Path(f"/proc/{process.popen.pid}")
            status = (proc / "status").read_text()
            rss = next(
                int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")
            )
            found[name] = {
                "threads": len(list((proc / "task").iterdir())),
                "fds": len(list((proc / "fd").iterdir())),
                "rss_kb": rss,
            }
        return found

    def depth(self) -> int:
        return self.node.ready_messages(QUEUE) + self.node.unacked(QUEUE)

    def dead_letters(self) -> set[str]:
        connection = pika.BlockingConnection(pika.URLParameters(self.node.url))
        channel = connection.channel()
        found: set[str] = set()
        while True:
            method, properties, _body = channel.basic_get(DLQ, auto_ack=True)
            if method is None:
                break
            found.add(str((properties.headers or {}).get("ce-id", "")))
        connection.close()
        return found

    def close(self) -> None:
        for process in self.replicas.values():
            process.kill()
        self.subscriber.close()
        for proxy in (*self.brokers.values(), *self.stores.values()):
            proxy.release()
            proxy.close()
        self.store.close()
        self.node.shutdown()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A replica killed mid-request resets its connection: the fault, not news."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class SoakSubscriber:
    """A real HTTP subscriber that keeps only what the ledger needs of each request
    (tests/support/subscriber.py keeps whole requests: too much for a long soak)."""

    def __init__(self, answer: Callable[[str, str], tuple[int, float]]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as real subscribers do

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                status, delay = answer(
                    self.headers.get("ce-id", ""), self.headers.get("x-replica", "?")
                )
                if delay:
                    time.sleep(delay)  # the subscriber being slow: the fault itself
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Publisher(threading.Thread):
    """Publishes unique events with confirms at a steady rate; one that was sent but
    not confirmed is sent again, with the same id (it may then be in the queue twice)."""

    def __init__(self, url: str, rate: float, ledger: Ledger) -> None:
        super().__init__(name="soak-publisher", daemon=True)
        self._url = url
        self._interval = 1.0 / rate
        self._ledger = ledger
        self.stop = threading.Event()

    def run(self) -> None:
        serial = 0
        channel = None
        next_at = time.monotonic()
        pending: str | None = None
        while not self.stop.is_set():
            if channel is None:
                channel = self._connect()
                continue
            event_id = pending or f"soak-{serial:07d}"
            self._ledger.publishes[event_id] += 1
            try:
                channel.basic_publish(
                    "",
                    QUEUE,
                    b'{"soak": true}',
                    pika.BasicProperties(
                        headers={
                            "ce-specversion": "1.0",
                            "ce-id": event_id,
                            "ce-source": "/soak",
                            "ce-type": "dev.soak.event",
                        },
                        content_type="application/json",
                        delivery_mode=2,
                    ),
                    mandatory=True,
                )
            except (pika.exceptions.AMQPError, OSError):
                pending, channel = event_id, None  # maybe queued: sent again, maybe twice
                continue
            self._ledger.confirmed.add(event_id)
            if pending is None:
                serial += 1
            pending = None
            next_at += self._interval
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def _connect(self) -> Any:
        try:
            connection = pika.BlockingConnection(pika.URLParameters(self._url))
            channel = connection.channel()
            channel.confirm_delivery()
            return channel
        except (pika.exceptions.AMQPError, OSError):
            self.stop.wait(0.5)
            return None


class Schedule(threading.Thread):
    """One fault at a time, each followed by a calm spell, chosen by the seed."""

    KINDS = (
        "broker-reset",
        "broker-blackhole",
        "broker-restart",
        "server-close",
        "subscriber-down",
        "subscriber-slow",
        "store-blackhole",
        "store-restart-empty",
        "replica-sigkill",
        "replica-sigterm",
    )

    def __init__(self, fleet: Fleet, seed: int) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self._fleet = fleet
        self._random = random.Random(seed)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self._random.uniform(8, 20)):
            kind = self._random.choice(self.KINDS)
            # Replica "b" is never killed or restarted: its threads, descriptors
            # and memory must come out of every other fault where they went in.
            replica = "a" if kind.startswith("replica-") else self._random.choice(REPLICAS)
            fault = Fault(kind, replica, time.monotonic())
            print(f"[soak] {time.strftime('%H:%M:%S')} fault {kind} ({replica})", flush=True)
            try:
                self._inject(fault)
            except Exception as e:  # the soak goes on; the fault is in the report
                print(f"[soak] fault {kind} failed: {e}", flush=True)
            fault.end = time.monotonic()
            self._fleet.ledger.faults.append(fault)

    def _inject(self, fault: Fault) -> None:
        fleet, name, hold = self._fleet, fault.target, self._random.uniform(3, 8)
        if fault.kind == "broker-reset":
            fleet.brokers[name].reset_all()
        elif fault.kind == "broker-blackhole":
            fleet.brokers[name].blackhole()  # silence: no RST, no FIN; the heartbeat tells
            self.stop.wait(hold)
            fleet.brokers[name].restore()
        elif fault.kind == "broker-restart":
            fault.target = "broker"
            fleet.node.stop_app()
            self.stop.wait(hold)
            fleet.node.start_app()
        elif fault.kind == "server-close":
            fault.target = "broker"
            fleet.node.close_all_connections()
        elif fault.kind in ("subscriber-down", "subscriber-slow"):
            fault.target = "subscriber"
            fleet.subscriber_mode = fault.kind.split("-")[1]
            self.stop.wait(hold)
            fleet.subscriber_mode = "up"
        elif fault.kind == "store-blackhole":
            fault.target = self._random.choice((*REPLICAS, "both"))
            paths = REPLICAS if fault.target == "both" else (fault.target,)
            for path in paths:
                fleet.stores[path].blackhole()
            self.stop.wait(hold)
            for path in paths:
                fleet.stores[path].restore()
        elif fault.kind == "store-restart-empty":
            fault.target = "store"
            fleet.store.kill()
            fleet.store.start()
        else:  # replica-sigkill, replica-sigterm
            process = fleet.replicas[name]
            process.popen.send_signal(
                signal.SIGKILL if fault.kind == "replica-sigkill" else signal.SIGTERM
            )
            process.popen.wait(30)
            fleet.start_replica(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=120.0, help="events published per second")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--refused", type=int, default=10, help="one event in N is answered 400")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answer")
    parser.add_argument("--out", type=Path, default=Path(".soak") / time.strftime("%Y%m%d-%H%M%S"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"[soak] {args.minutes} min at {args.rate}/s, seed {args.seed}, out {args.out}")
    ledger = Ledger()
    fleet = Fleet(args.out, ledger, args.refused, args.latency)
    try:
        publisher = Publisher(fleet.node.url, args.rate, ledger)
        schedule = Schedule(fleet, args.seed)
        publisher.start()
        warm = min(60.0, args.minutes * 60 / 4)
        time.sleep(warm)  # the soak's own length, not a synchronisation
        before = fleet.resources()
        schedule.start()
        time.sleep(args.minutes * 60 - warm)
        schedule.stop.set()
        schedule.join(120)
        publisher.stop.set()
        publisher.join(30)
        drained = wait_for_drain(fleet)
        after = fleet.resources()
        for process in fleet.replicas.values():
            process.stop(timeout=30)
        fleet.save_logs()
        ledger.dead_lettered = fleet.dead_letters()
    finally:
        fleet.close()
    report = ledger.report()
    report.update(seed=args.seed, minutes=args.minutes, rate=args.rate, drained=drained)
    report["resources"] = {"before_faults": before, "after_drain": after}
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    print(table(report))
    for name in after:
        print(f"[soak] replica {name}, never restarted: {before.get(name)} -> {after[name]}")
    unexplained = report["duplicates_by_class"].get("unexplained", 0)
    for duplicate in report["duplicates"]:
        print(f"[soak] duplicate {duplicate['id']} ({duplicate['class']}): {duplicate['requests']}")
    if report["lost"]:
        print(f"[soak] LOST: {report['lost'][:20]}")
    return 1 if report["lost"] or unexplained or not drained else 0


def wait_for_drain(fleet: Fleet, timeout: float = 300) -> bool:
    """Every message settled: the queue holds nothing, ready or unacked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if fleet.depth() == 0:
            return True
        time.sleep(1)
    return False


if __name__ == "__main__":
    sys.exit(main())
