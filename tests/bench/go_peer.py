"""Contender (c): the Go dispatcher of Knative's design (../shared/bench/go-peer).

amqp091-go, prefetch = parallelism, one worker goroutine per slot, one shared
net/http client, ack after a 2xx: no retries, dead letters, dedupe or metrics.
It is the floor of what this job costs in a compiled language, and the bar of
issue 22. ``make bench`` builds it here, from Debian's Go toolchain and
amqp091-go (installed when missing and the bench runs as root), into
``.cache/go-peer``, again only when its source changed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

from tests.bench.harness import ROOT, BenchError

SOURCE: Final = ROOT.parent / "shared/bench/go-peer"
BINARY: Final = ROOT / ".cache/go-peer"
PACKAGES: Final = ("golang-go", "golang-github-rabbitmq-amqp091-go-dev")
GOPATH: Final = "/usr/share/gocode"  # where Debian installs Go sources


def available() -> bool:
    return (SOURCE / "main.go").is_file()


def build() -> Path:
    """The peer's binary, built if it is missing or older than its source."""
    if not available():
        raise BenchError(f"bench: the Go peer's source is not at {SOURCE}")
    source = SOURCE / "main.go"
    if BINARY.exists() and BINARY.stat().st_mtime >= source.stat().st_mtime:
        return BINARY
    go = _toolchain()
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": GOPATH,
        "GOCACHE": str(ROOT / ".cache/go-build"),
    }
    built = subprocess.run(
        [go, "build", "-o", str(BINARY), "."],  # GOPATH mode takes no absolute package path
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise BenchError(f"bench: building the Go peer failed:\n{built.stderr}")
    return BINARY


def _toolchain() -> str:
    go = shutil.which("go") or "/usr/lib/go/bin/go"
    amqp = Path(GOPATH, "src/github.com/rabbitmq/amqp091-go")
    if Path(go).exists() and amqp.is_dir():
        return go
    if os.geteuid() != 0:
        raise BenchError(
            "bench: the Go peer needs Debian's Go toolchain and amqp091-go:\n"
            f"       apt-get install -y {' '.join(PACKAGES)}"
        )
    install = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    if subprocess.run(install, check=False, capture_output=True).returncode != 0:
        # The package lists may be stale on a fresh machine.
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        if subprocess.run(install, check=False, capture_output=True).returncode != 0:
            raise BenchError(f"bench: apt-get install {' '.join(PACKAGES)} failed")
    return shutil.which("go") or "/usr/lib/go/bin/go"


def argv(url: str, queue: str, sink: str, parallelism: int) -> list[str]:
    """The peer takes its settings from the environment: ``env`` sets them and execs it
    (one process, so /proc measures the peer itself)."""
    return [
        "env",
        f"AMQP_URL={url}",
        f"BENCH_QUEUE={queue}",
        f"BENCH_SINK_URL={sink}",
        f"BENCH_PARALLELISM={parallelism}",
        str(BINARY),
    ]
