"""The operations surface against a running `dispatcher run` process (issue 4)."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import structlog
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import broker
from tests.support.broker import event_headers, publish, wait_until
from tests.support.process import ROOT, DispatcherProcess, child_env
from tests.support.promtool import promtool_binary
from tests.support.subscriber import Received, Reply

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

CONTRACT_METRICS = {
    "dispatcher_events_total": {"binding", "outcome"},
    "dispatcher_delivery_attempts_total": {"binding", "code_class"},
    "dispatcher_dispatch_duration_seconds": {"binding"},
    "dispatcher_inflight": {"binding"},
    "dispatcher_consumer_up": {"binding"},
    "dispatcher_broker_connected": set(),
    "dispatcher_reconnects_total": {"reason"},
    "dispatcher_stale_acks_total": {"binding"},
    "dispatcher_duplicates_suppressed_total": {"binding"},
    "dispatcher_broker_blocked": set(),
}


def config(queue: str, subscriber: str, **binding: object) -> dict[str, object]:
    return {
        "broker": {"url": broker.URL, "connection_name": f"ops-{queue}"},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": "2s"},
        "bindings": [
            {
                "name": "ops",
                "queue": queue,
                "subscriber": subscriber,
                "declare": {"durable": True},
                "delivery": {"retry": 2, "backoff_delay": "10ms", "timeout": "7s"},
                **binding,
            }
        ],
    }


@pytest.fixture
def queue():
    name = broker.unique("ops")
    yield name
    broker.delete([name])


@pytest.fixture
def processes():
    started: list[DispatcherProcess] = []

    def start(cfg: dict[str, object] | None, directory: Path, **env: str) -> DispatcherProcess:
        p = DispatcherProcess(cfg, directory, env=env)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()


def queue_exists(name: str) -> bool:
    try:
        broker.queue_depth(name)
    except Exception:  # 404 from a passive declare
        return False
    return True


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, frozenset(s.labels.items()))] = s.value
    return found


def value(found, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def scripted(script: dict[str, list[int]]):
    seen: dict[str, int] = {}

    def behaviour(request: Received, _i: int) -> Reply:
        event_id = request.headers.get("ce-id", "")
        n = seen.get(event_id, 0)
        seen[event_id] = n + 1
        statuses = script.get(event_id, [200])
        return Reply(statuses[min(n, len(statuses) - 1)])

    return behaviour


def test_probes_metrics_and_logs_after_a_known_sequence(
    queue, make_subscriber, processes, tmp_path
):
    sub = make_subscriber(scripted({"ok-1": [200], "ok-2": [503, 200], "bad-1": [400]}))
    sink = make_subscriber(lambda _r, _i: Reply(202))
    proc = processes(config(queue, sub.url, dead_letter={"sink": sink.url}), tmp_path)
    proc.wait_for("consumer attached", binding="ops")
    assert proc.get("/healthz")[0] == 200
    status, content_type, body = proc.get("/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True})
    assert content_type == "application/json"
    assert proc.get("/nope")[0] == 404

    for event_id in ("ok-1", "ok-2", "bad-1"):
        publish(queue, headers=event_headers(event_id))
    wait_until(
        lambda: sum(1 for line in proc.lines if line.get("event") == "delivery") == 3,
        20,
        "three delivery lines",
    )

    status, content_type, text = proc.get("/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    assert "_created" not in text
    found = samples(text)
    assert value(found, "dispatcher_events_total", binding="ops", outcome="delivered") == 2
    assert value(found, "dispatcher_events_total", binding="ops", outcome="dead_lettered") == 1
    assert value(found, "dispatcher_events_total", binding="ops", outcome="requeued") == 0
    assert value(found, "dispatcher_events_total", binding="ops", outcome="rejected") == 0
    attempts = {
        cls: value(found, "dispatcher_delivery_attempts_total", binding="ops", code_class=cls)
        for cls in ("2xx", "3xx", "4xx", "5xx", "error")
    }
    assert attempts == {"2xx": 2, "3xx": 0, "4xx": 1, "5xx": 1, "error": 0}
    assert value(found, "dispatcher_dispatch_duration_seconds_count", binding="ops") == 4
    # The configured 7 s timeout is a bucket boundary, so "how many hit the timeout" is exact.
    assert value(found, "dispatcher_dispatch_duration_seconds_bucket", binding="ops", le="7.0") == 4
    assert value(found, "dispatcher_inflight", binding="ops") == 0
    assert value(found, "dispatcher_consumer_up", binding="ops") == 1
    assert value(found, "dispatcher_broker_connected") == 1
    assert value(found, "dispatcher_broker_blocked") == 0
    assert value(found, "dispatcher_stale_acks_total", binding="ops") == 0
    assert value(found, "dispatcher_duplicates_suppressed_total", binding="ops") == 0
    assert value(found, "dispatcher_delivery_timeout_seconds", binding="ops") == 7
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, labels in CONTRACT_METRICS.items():
        family = name.removesuffix("_total")
        assert family in families, f"{name} missing from /metrics"
        for s in families[family].samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)

    deliveries = {line["ce_id"]: line for line in proc.lines if line.get("event") == "delivery"}
    assert deliveries["ok-2"]["attempts"] == 2 and deliveries["ok-2"]["status"] == 200
    assert deliveries["bad-1"]["outcome"] == "dead_lettered"
    assert deliveries["bad-1"]["status"] == 400
    for line in deliveries.values():
        assert {
            "binding",
            "outcome",
            "ce_id",
            "ce_type",
            "ce_source",
            "attempts",
            "status",
            "duration_ms",
            "redelivered",
            "timestamp",
        } <= set(line)

    # A forced close of our connection: counted by reason, readiness comes back.
    subprocess.run(
        [
            "rabbitmqctl",
            "eval",
            '[rabbit_networking:close_connection(P, "ops test") || P <- '
            'rabbit_networking:connections(), lists:member({<<"connection_name">>, longstr, '
            f'<<"ops-{queue}-consumer">>}}, proplists:get_value(client_properties, '
            "rabbit_networking:connection_info(P, [client_properties]), []))], ok.",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    proc.wait_for("broker disconnected", reason="closed_by_broker")
    wait_until(lambda: proc.get("/readyz")[0] == 200, 20, "ready again")
    found = samples(proc.get("/metrics")[2])
    assert value(found, "dispatcher_reconnects_total", reason="closed_by_broker") == 1

    # Shutdown: readiness goes 503 first; lifecycle lines name what happened.
    assert proc.stop() == 0
    events = [line.get("event") for line in proc.lines]
    for lifecycle in (
        "listening",
        "broker connected",
        "consumer attached",
        "broker disconnected",
        "consumer cancelled",
        "shutdown started",
        "shutdown complete",
    ):
        assert lifecycle in events, lifecycle


def test_readyz_names_the_bindings_that_are_down(queue, make_subscriber, processes, tmp_path):
    cfg = config(queue, make_subscriber().url)
    cfg["bindings"].append(  # type: ignore[attr-defined]
        {
            "name": "ghost",
            "queue": broker.unique("never-declared"),
            "subscriber": "http://127.0.0.1:1/",
        }
    )
    proc = processes(cfg, tmp_path)
    proc.wait_for("consumer attached", binding="ops")
    proc.wait_for("channel closed", binding="ghost")  # 404 NOT_FOUND, retried with backoff
    status, _, body = proc.get("/readyz")
    assert (status, json.loads(body)) == (503, {"ready": False, "down": ["ghost"]})
    assert proc.get("/healthz")[0] == 200  # alive, just not ready


def test_passwords_never_appear(queue, make_subscriber, processes, tmp_path):
    cfg = config(queue, "http://user:hunter2@127.0.0.1:1/")
    cfg["broker"] = {"url": "amqp://guest:s3cr3t-pw@127.0.0.1:5672/%2F"}  # wrong: auth fails
    proc = processes(cfg, tmp_path)
    proc.wait_for("broker connect failed")
    proc.wait_for("broker disconnected")
    metrics = proc.get("/metrics")[2]
    assert proc.get("/readyz")[0] == 503
    proc.stop()
    for text in (proc.output(), metrics):
        assert "s3cr3t-pw" not in text
        assert "hunter2" not in text


def test_basic_auth_from_urls_is_sent_and_its_password_never_shown(
    queue, make_subscriber, processes, tmp_path
):
    sub = make_subscriber(lambda _r, _i: Reply(400))
    sink = make_subscriber()
    with_user = sub.url.replace("http://", "http://alice:hunter2-pw@")
    cfg = config(
        queue, with_user, dead_letter={"sink": sink.url.replace("://", "://bob:s3cr3t-pw@")}
    )
    proc = processes(cfg, tmp_path, LOG_LEVEL="debug")
    proc.wait_for("consumer attached", binding="ops")
    publish(queue, headers=event_headers("basic-1"))
    [letter] = sink.wait_for(1)
    [request] = sub.wait_for(1)
    metrics = proc.get("/metrics")[2]
    proc.stop()
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "dispatcher",
            "check",
            "--config",
            str(tmp_path / "dispatcher.yaml"),
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=60,
    )
    assert request.headers["authorization"] == "Basic " + b64("alice:hunter2-pw")
    assert letter.headers["authorization"] == "Basic " + b64("bob:s3cr3t-pw")
    assert letter.headers["ce-knativeerrordest"] == with_user.replace("hunter2-pw", "***")
    assert checked.returncode == 0, checked.stderr
    assert "alice:***@" in checked.stdout
    for text in (proc.output(), metrics, checked.stdout, checked.stderr):
        assert "hunter2" not in text
        assert "s3cr3t" not in text
        assert b64("alice:hunter2-pw") not in text


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_log_format_console_and_level(queue, make_subscriber, processes, tmp_path):
    sub = make_subscriber()
    proc = processes(config(queue, sub.url), tmp_path, LOG_FORMAT="console", LOG_LEVEL="warning")
    wait_until(lambda: queue_exists(queue), 20, "the process to declare its queue")
    publish(queue, headers=event_headers("quiet-1"))
    sub.wait_for(1)
    wait_until(lambda: broker.queue_depth(queue) == 0, 10, "the queue to drain")
    proc.stop()
    output = proc.output()
    assert proc.lines == []  # no JSON in console format
    assert "quiet-1" not in output  # the info-level delivery line is filtered


def test_delivery_context_does_not_leak_between_tasks(make_subscriber, run_service, capsys):
    from dispatcher.event import http as http_binding

    original = http_binding.trace_headers
    calls = []

    def leaky(headers):
        if not calls:
            structlog.contextvars.bind_contextvars(stray="from-the-first-delivery")
        calls.append(1)
        return original(headers)

    sub = make_subscriber()
    svc = run_service(sub.url, parallelism=1)
    http_binding.trace_headers = leaky
    try:
        publish(svc.queue, headers=event_headers("leak-1"))
        svc.wait_events("delivered", 1)
        publish(svc.queue, headers=event_headers("leak-2"))
        svc.wait_events("delivered", 2)
    finally:
        http_binding.trace_headers = original
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    second = next(
        line for line in lines if line.get("event") == "delivery" and line["ce_id"] == "leak-2"
    )
    assert "stray" not in second


def test_healthz_turns_503_when_the_broker_loop_is_stuck(make_subscriber, run_service):
    import urllib.error
    import urllib.request

    svc = run_service(make_subscriber().url)
    supervisor = svc.service.supervisor
    port = svc.service.ops.port

    def healthz() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    assert healthz() == 200
    started = time.monotonic()
    assert supervisor.run_on_loop(lambda: time.sleep(14))  # a stuck loop
    wait_until(lambda: healthz() == 503, 15, "healthz to notice the stuck loop")
    assert time.monotonic() - started < 12 + 1  # within STUCK_AFTER plus a tick
    wait_until(lambda: healthz() == 200, 15, "healthz to recover")


def test_readyz_is_503_during_shutdown(make_subscriber, run_service):
    svc = run_service(make_subscriber().url)
    assert svc.service.ops.readyz()[0] == 200
    svc.service.request_stop()
    assert svc.service.ops.readyz() == (503, {"ready": False, "reason": "shutting down"})


def test_dashboard_and_rules_only_use_exported_metrics(queue, make_subscriber, processes, tmp_path):
    # With a breaker: its series exist only for bindings that have one.
    proc = processes(config(queue, make_subscriber().url, circuit_breaker={}), tmp_path)
    proc.wait_for("consumer attached")
    exported = {
        s.name for f in text_string_to_metric_families(proc.get("/metrics")[2]) for s in f.samples
    }
    exported |= {"dispatcher_reconnects_total"}  # labelled by reason: no sample until one
    dashboard = json.loads((ROOT / "deploy/grafana/dispatcher-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = (ROOT / "deploy/prometheus/dispatcher-alerts.yaml").read_text()
    for source in [*exprs, rules]:
        for name in re.findall(r"\bdispatcher_[a-z_]+", source):
            assert name in exported, f"{name} is not exported"
    used = {n for e in exprs for n in re.findall(r"\bdispatcher_[a-z_]+", e)}
    for wanted in (
        "dispatcher_events_total",
        "dispatcher_delivery_attempts_total",
        "dispatcher_dispatch_duration_seconds_bucket",
        "dispatcher_inflight",
        "dispatcher_consumer_up",
        "dispatcher_reconnects_total",
        "dispatcher_stale_acks_total",
        "dispatcher_circuit_state",
        "dispatcher_rate_limited_seconds_total",
    ):
        assert wanted in used, f"the dashboard does not show {wanted}"


def test_alert_rules_pass_promtool():
    promtool = str(promtool_binary())  # on PATH, else fetched once into .cache/
    rules = ROOT / "deploy/prometheus/dispatcher-alerts.yaml"
    check = subprocess.run(
        [promtool, "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [promtool, "test", "rules", str(ROOT / "tests/ops/alerts_test.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_knative_drop_in_mode(queue, make_subscriber, processes, tmp_path):
    sub = make_subscriber()
    with broker.channel() as ch:
        ch.queue_declare(queue, durable=True)  # Knative's controller declares it, not us
    proc = processes(
        None,
        tmp_path,
        QUEUE_NAME=queue,
        RABBIT_URL=broker.URL,
        SUBSCRIBER=sub.url,
        PARALLELISM="3",
        RETRY="1",
        BACKOFF_DELAY="0",
        DISPATCHER_LISTEN="127.0.0.1:0",
    )
    proc.wait_for("consumer attached")
    publish(queue, headers=event_headers("kn-1"))
    assert sub.wait_for(1)[0].headers["ce-id"] == "kn-1"
    proc.wait_for("delivery", ce_id="kn-1")
    assert proc.stop() == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PARALLELISM": "many"}, "PARALLELISM: must be an integer"),
        ({"RETRY": "-1"}, "RETRY: must be >= 0"),
        ({"BACKOFF_POLICY": "fibonacci"}, "BACKOFF_POLICY: must be one of"),
        ({"BACKOFF_DELAY": "soon"}, "BACKOFF_DELAY: invalid duration"),
        ({"TIMEOUT": "-5s"}, "TIMEOUT"),
        ({"SUBSCRIBER": "ftp://x/"}, "SUBSCRIBER: must be an http(s) URL"),
        ({"SUBSCRIBER": ""}, "SUBSCRIBER: required"),
        ({"DEAD_LETTER_SINK": "nope"}, "DEAD_LETTER_SINK"),
    ],
)
def test_knative_mode_errors_name_the_variable(tmp_path, env, message):
    result = knative_check(tmp_path, env)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_knative_mode_check_says_a_tracing_protocol_it_does_not_speak_leaves_tracing_off(
    tmp_path,
):
    observability = {"tracing": {"protocol": "grpc", "endpoint": "otel:4317"}}
    result = knative_check(tmp_path, {"K_OBSERVABILITY_CONFIG": json.dumps(observability)})
    assert result.returncode == 0, result.stderr
    assert (
        "dispatcher: warning: K_OBSERVABILITY_CONFIG: asks for tracing over grpc, which this "
        "dispatcher does not speak (only http/protobuf): tracing is off\n"
    ) in result.stderr
    assert yaml.safe_load(result.stdout)["tracing"]["enabled"] is False


def knative_check(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``dispatcher check`` in drop-in mode: Knative's variables, ``env`` over them,
    and nothing else of this process's environment."""
    base = {"QUEUE_NAME": "q", "RABBIT_URL": broker.URL, "SUBSCRIBER": "http://127.0.0.1:1/"}
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", "check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **base, **env},
    )


def test_shutdown_signals_are_taken_by_one_thread_only(queue, make_subscriber, processes, tmp_path):
    # No thread may run a Python handler for them: CPython 3.11 could lose the
    # main thread's wake-up for one, and a second SIGTERM then waited out the
    # grace period. Every thread blocks them but the signals thread, which waits
    # in sigwait (the kernel unblocks them for it meanwhile): dispatcher/signals.py.
    sub = make_subscriber(lambda _r, _i: Reply(200))
    proc = processes(config(queue, sub.url), tmp_path)
    proc.wait_for("consumer attached", binding="ops")
    wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    pid = proc.popen.pid
    blocked = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        mask = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        blocked[int(task.name)] = int(mask.split()[1], 16) & wanted
    assert len(blocked) >= 4  # main, signals, the engine loop, the ops listener
    taking = [tid for tid, mask in blocked.items() if mask != wanted]
    assert len(taking) == 1 and taking[0] != pid, blocked
    assert blocked[taking[0]] == 0
