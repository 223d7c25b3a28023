"""The command line as users run it: real processes, exit codes, stderr."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support import broker
from tests.support.broker import event_headers, publish
from tests.support.process import child_env

ROOT = Path(__file__).resolve().parents[2]


def dispatcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatcher", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=child_env(env),  # a clean base: the caller's RABBITMQ_URL must not win
    )


def write_config(
    tmp_path: Path, queue: str, subscriber: str, password: str = "s3cret", **top: object
) -> Path:
    config = {
        "broker": {"url": f"amqp://guest:{password}@127.0.0.1:5672/%2F"},
        "http": {"listen": "127.0.0.1:0"},
        "shutdown": {"grace": "2s"},
        "bindings": [
            {"name": "cli", "queue": queue, "subscriber": subscriber, "declare": {"durable": True}}
        ],
        **top,
    }
    path = tmp_path / "dispatcher.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_check_prints_the_effective_config_with_the_password_redacted(tmp_path):
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    result = dispatcher("check", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout
    assert "amqp://guest:***@127.0.0.1:5672/%2F" in result.stdout
    assert yaml.safe_load(result.stdout)["bindings"][0]["delivery"]["retry"] == 5


@pytest.mark.parametrize(
    ("dead_letter", "warned"),
    [({}, True), ({"sink": "http://127.0.0.1:1/"}, False), ({"exchange": ""}, False)],
)
def test_check_warns_about_a_binding_without_a_dead_letter_target(tmp_path, dead_letter, warned):
    """Valid (exit 0), but an event that cannot be delivered is then rejected and,
    without a dead-letter exchange on the queue, lost: check says so on stderr."""
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    config = yaml.safe_load(path.read_text())
    config["bindings"][0]["dead_letter"] = dead_letter
    path.write_text(yaml.safe_dump(config))
    result = dispatcher("check", "--config", str(path))
    assert result.returncode == 0, result.stderr
    warning = (
        "dispatcher: warning: bindings[0].dead_letter: binding 'cli' has no dead-letter target"
    )
    assert (warning in result.stderr) is warned, result.stderr
    assert yaml.safe_load(result.stdout)["bindings"][0]["name"] == "cli"  # stdout stays YAML


def test_check_reads_dispatcher_config_and_rabbitmq_url(tmp_path):
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    result = dispatcher(
        "check",
        env={"DISPATCHER_CONFIG": str(path), "RABBITMQ_URL": "amqp://u:hunter2@elsewhere:5672/v"},
    )
    assert result.returncode == 0, result.stderr
    assert "amqp://u:***@elsewhere:5672/v" in result.stdout
    assert "hunter2" not in result.stdout


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda c: c["bindings"][0].update(delivery={"retry": -1}),
            "bindings[0].delivery.retry: must be >= 0",
        ),
        (lambda c: c.update(colour="blue"), "colour: unknown key"),
        (lambda c: c["bindings"][0].update(parallelism="ten"), "bindings[0].parallelism"),
    ],
)
def test_bad_config_exits_2_naming_the_key_without_traceback(tmp_path, mutate, expected):
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    config = yaml.safe_load(path.read_text())
    mutate(config)
    path.write_text(yaml.safe_dump(config))
    for command in ("check", "run"):
        result = dispatcher(command, "--config", str(path))
        assert result.returncode == 2
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
        assert "s3cret" not in result.stderr


def test_check_lists_every_problem_of_the_file_one_per_line(tmp_path):
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    config = yaml.safe_load(path.read_text())
    config["broker"] = {"heartbeat": "0s", "reconnect": {"initial_delay": 0}}
    config["bindings"][0].update(parallelism=0, colour="blue")
    config["bindings"].append({"name": "b", "queue": "", "subscriber": "ftp://x/"})
    path.write_text(yaml.safe_dump(config))
    for command in ("check", "run"):
        result = dispatcher(command, "--config", str(path))
        assert result.returncode == 2
        assert result.stderr.splitlines() == [
            "dispatcher: broker.heartbeat: must be at least 1s "
            "(heartbeats detect silent connections)",
            "dispatcher: broker.reconnect.initial_delay: must be > 0",
            # An unknown key first in its section: a misspelt key explains the rest.
            "dispatcher: bindings[0].colour: unknown key (expected one of: auth, "
            "circuit_breaker, content_mode, dead_letter, declare, dedupe_window, delivery, "
            "filter, filters, headers, max_body_size, name, non_cloudevent, ordered, "
            "parallelism, prefetch, queue, reply, subscriber, tls)",
            "dispatcher: bindings[0].parallelism: must be between 1 and 65535",
            "dispatcher: bindings[1].queue: must not be empty",
            "dispatcher: bindings[1].subscriber: must be an http(s) URL, got 'ftp://x/'",
        ]


def test_missing_config_file_exits_2(tmp_path):
    result = dispatcher("check", "--config", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_console_script_and_launcher_exist(tmp_path):
    path = write_config(tmp_path, "q", "http://127.0.0.1:1/")
    script = Path(sys.executable).parent / "dispatcher"
    console = subprocess.run(
        [str(script), "check", "--config", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
        env=child_env(),
    )
    assert console.returncode == 0
    launcher = subprocess.run(
        [sys.executable, str(ROOT / "cmd" / "dispatcher.py"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=child_env(),
    )
    assert launcher.stdout.startswith("dispatcher ")
    assert not (ROOT / "cmd" / "__init__.py").exists()


@pytest.mark.broker
@pytest.mark.timeout(60)
def test_run_delivers_then_stops_cleanly_on_sigterm(tmp_path, subscriber):
    queue = broker.unique("cli")
    path = write_config(tmp_path, queue, subscriber.url, password="guest")
    process = subprocess.Popen(
        [sys.executable, "-m", "dispatcher", "run", "--config", str(path)],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == "consumer attached":
                break
        publish(queue, headers=event_headers("cli-1"))
        for line in process.stdout:
            lines.append(json.loads(line))
            if lines[-1]["event"] == "delivery":
                break
        assert lines[-1]["ce_id"] == "cli-1"
        assert subscriber.requests[0].headers["ce-id"] == "cli-1"
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - started < 2 + 5  # grace + close bound
        output = process.stdout.read()
        assert "shutdown complete" in output
        assert "guest:guest" not in output + json.dumps(lines)
    finally:
        if process.poll() is None:
            process.kill()
        broker.delete([queue])


@pytest.mark.parametrize(
    "args",
    [
        ["-m", "dispatcher", "--help"],
        *(["-m", "dispatcher", command, "--help"] for command in ("run", "check", "archive")),
        *(["-m", "dispatcher", command, "--help"] for command in ("report", "replay")),
        [str(ROOT / "cmd" / "demo_subscriber.py"), "--help"],
        [str(ROOT / "cmd" / "publish_demo.py"), "--help"],
    ],
    ids=lambda args: " ".join(Path(a).name for a in args),
)
def test_help_works_with_docstrings_stripped(args):
    """``python -OO`` (and PYTHONOPTIMIZE=2 in some images) drops every docstring."""
    result = subprocess.run(
        [sys.executable, "-OO", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: ")
    assert "Traceback" not in result.stderr
