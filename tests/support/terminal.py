"""Run a command with its stdout on a pseudo-terminal, as a user at a shell sees it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path


def run_on_terminal(
    argv: list[str], *, cwd: Path, env: dict[str, str], stderr: Path, timeout: float
) -> tuple[int, str]:
    """Exit code and everything written to the terminal (``\\r\\n`` read back as
    ``\\n``); stderr goes to a file."""
    master, slave = pty.openpty()
    with stderr.open("w") as errors:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=errors
        )
    os.close(slave)
    received = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            received += chunk
        code = process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(master)
    return code, received.decode("utf-8", "replace").replace("\r\n", "\n")
