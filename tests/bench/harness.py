"""Child processes of the benchmark, and what /proc says about them.

Every child (nginx, subscribers, contenders) is started through ``CHILDREN``:
in a session of its own (so a Ctrl-C in the terminal reaches only the bench,
which then stops them in order) and with ``PR_SET_PDEATHSIG`` (so none
outlives a bench that is killed outright). ``CHILDREN.kill_all()`` runs on
every exit path.

CPU is utime+stime (plus the children's cutime+cstime) from
``/proc/<pid>/stat``, summed over a process tree; memory is VmRSS or VmHWM
and threads are ``Threads`` from ``/proc/<pid>/status``, summed over the tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Final

ROOT: Final = Path(__file__).resolve().parents[2]
PYTHON: Final = sys.executable
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG: Final = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


class BenchError(Exception):
    """A run that must not be reported: lost or duplicated events, a dead contender."""


def _die_with_parent() -> None:
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Children:
    """Every process the bench started, so that all of them can be stopped."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, argv: Sequence[str], log: Path | None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        out: IO[bytes] | int = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 (threads: only the feeder, idle here)
            )
        finally:
            if not isinstance(out, int):
                out.close()
        self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 30.0) -> int | None:
        """SIGTERM to the process, SIGKILL to its whole group after ``grace`` s."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers: worker processes, nginx workers
        proc.wait()
        if proc in self._procs:
            self._procs.remove(proc)
        return proc.returncode

    def kill_all(self) -> None:
        for proc in list(self._procs):
            self.stop(proc, grace=5.0)


CHILDREN: Final = Children()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


# ----------------------------------------------------------------- /proc


def _parents() -> dict[int, int]:
    parents = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(entry.path, "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def tree(roots: Iterable[int]) -> list[int]:
    """The roots and all their live descendants."""
    parents = _parents()
    found = [pid for pid in roots if pid in parents]
    frontier = set(found)
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = set(children)
    return found


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # fields[11..14] are utime, stime, cutime, cstime (stat fields 14-17)
    return sum(int(value) for value in fields[11:15]) / CLK_TCK


def _status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def tree_cpu(roots: Iterable[int]) -> float:
    """CPU seconds (user+system) used so far by the tree."""
    total = 0.0
    for pid in tree(roots):
        with contextlib.suppress(OSError):
            total += _cpu(pid)
    return total


def tree_threads(roots: Iterable[int]) -> int:
    """Threads of every process in the tree, now."""
    total = 0
    for pid in tree(roots):
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    total += int(line.split()[1])
    return total


def tree_memory(roots: Iterable[int], key: str = "VmRSS") -> float:
    """MB of ``key`` (VmRSS now, VmHWM peak) summed over the tree."""
    total = 0.0
    for pid in tree(roots):
        with contextlib.suppress(OSError):
            total += _status_mb(pid, key)
    return total
