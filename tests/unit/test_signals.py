"""The first SIGTERM/SIGINT asks to stop; the second ends the process at once.

Each case runs in a child process: the second signal calls ``os._exit``. The
child's main thread sits in a long wait (as ``run`` does for its grace period)
while another thread keeps the interpreter busy, the conditions under which
CPython 3.11 lost a Python-level handler's wake-up.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import os, sys, threading
    from dispatcher.signals import Signals

    def say(line):  # one write per line: two threads print, print writes twice
        os.write(1, line.encode() + b"\\n")

    def busy():
        while True:
            sum(range(1000))

    def on_first():
        if sys.argv[1] == "failing":
            raise RuntimeError("cannot ask")
        say("asked")
        if sys.argv[1] == "blocking":
            threading.Event().wait(60)  # a call into a JVM that never answers

    with Signals(on_first) as signals:
        threading.Thread(target=busy, daemon=True).start()
        say("ready")
        signals.requested.wait()
        say("stopping")
        threading.Event().wait(60)  # a grace period the operator will not wait for
    """
)


def _child(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(child: subprocess.Popen[str], *wanted: str, stream: str = "stdout") -> list[str]:
    """Lines up to the one where every ``wanted`` line has been seen, in any order."""
    lines = getattr(child, stream)
    assert lines is not None
    seen: list[str] = []
    for line in lines:  # bounded by the test's timeout
        seen.append(line.strip())
        if set(wanted) <= set(seen):
            return seen
    raise AssertionError(f"the child ended before {wanted!r}: {seen}")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("mode", "first", "second"),
    [
        ("asking", signal.SIGINT, signal.SIGINT),
        ("asking", signal.SIGTERM, signal.SIGINT),
        # An on_first that fails or never returns must not cost the second signal.
        ("failing", signal.SIGINT, signal.SIGTERM),
        ("blocking", signal.SIGTERM, signal.SIGTERM),
    ],
)
def test_the_second_signal_ends_the_process_at_once(mode, first, second):
    child = _child(mode)
    try:
        _read_until(child, "ready")
        child.send_signal(first)
        # on_first runs beside the stopping work: its line may come before or after.
        _read_until(child, "stopping", *(() if mode == "failing" else ("asked",)))
        said = []
        if mode == "failing":
            # Written by on_first's own thread, which may run after "stopping": waited
            # for, or the second signal's exit can come first (as it did under load).
            failed = "dispatcher: could not ask the work to stop: cannot ask"
            said = _read_until(child, failed, stream="stderr")
        started = time.monotonic()
        child.send_signal(second)
        code = child.wait(10)
        took = time.monotonic() - started
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code == 1
    assert took < 5, f"the second signal took {took:.1f}s"
    assert child.stderr is not None
    stderr = "\n".join(said) + "\n" + child.stderr.read()
    assert f"dispatcher: second {signal.Signals(second).name}, exiting now" in stderr
    assert ("could not ask the work to stop: cannot ask" in stderr) == (mode == "failing")


def test_signals_outside_the_block_behave_as_before():
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal\n"
            "from dispatcher.signals import Signals\n"
            "with Signals():\n    pass\n"
            "try:\n    os.kill(os.getpid(), signal.SIGINT)\n"
            "except KeyboardInterrupt:\n    print('default handler')\n",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout == "default handler\n"
