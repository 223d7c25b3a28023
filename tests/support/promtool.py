"""``promtool``, for checking and unit-testing the Prometheus alert rules.

A ``promtool`` on PATH is used as it is. Otherwise Debian's ``prometheus``
package is downloaded (not installed: no daemon, no root, nothing outside the
project) and ``usr/bin/promtool`` is taken out of it with ``dpkg -x`` into
``.cache/promtool/`` (git-ignored), so later runs need no network. apt checks
the package against the signed archive index; the index is kept in the same
cache folder when the machine has none (a container image without
``/var/lib/apt/lists``), so the machine's own apt state is never touched.

A file lock serialises parallel fetches and the binary is renamed into place,
so nobody runs a half-written file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.helm import ROOT, locked

PACKAGE = "prometheus"
CACHE_DIR = ROOT / ".cache" / "promtool"
_APT_STATE = CACHE_DIR / "apt"


def promtool_binary() -> Path:
    """A runnable promtool: the one on PATH, else the cached one, fetched if missing."""
    on_path = shutil.which("promtool")
    if on_path:
        return Path(on_path)
    path = CACHE_DIR / "promtool"
    if path.is_file() and os.access(path, os.X_OK):
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with locked(CACHE_DIR / "fetch.lock"):
        # Another process may have fetched it while we waited for the lock.
        if not (path.is_file() and os.access(path, os.X_OK)):
            _fetch(path)
    return path


def _apt(*args: str, cwd: Path, private_index: bool) -> subprocess.CompletedProcess[str]:
    options: list[str] = []
    if private_index:
        lists = _APT_STATE / "lists"
        (lists / "partial").mkdir(parents=True, exist_ok=True)
        (_APT_STATE / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        options = [
            f"-o=Dir::State::Lists={lists}",
            f"-o=Dir::Cache::archives={_APT_STATE / 'archives'}",
            # The private index is ours alone (under our own lock): the system's
            # apt locks are not needed, and taking them would need root.
            "-o=Debug::NoLocking=1",
        ]
    return subprocess.run(
        ["apt-get", "-q", *options, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _download(work: Path) -> Path:
    """The package's .deb in ``work``: with the machine's index, else with our own."""
    attempts: list[str] = []
    for private_index in (False, True):
        if private_index:
            updated = _apt("update", cwd=work, private_index=True)
            if updated.returncode != 0:
                attempts.append(f"apt-get update: {updated.stderr.strip()}")
                break
        got = _apt("download", PACKAGE, cwd=work, private_index=private_index)
        debs = list(work.glob(f"{PACKAGE}_*.deb"))
        if got.returncode == 0 and len(debs) == 1:
            return debs[0]
        attempts.append(f"apt-get download {PACKAGE}: {got.stderr.strip()}")
    raise RuntimeError(
        "promtool could not be fetched from Debian's archive:\n"
        + "\n".join(attempts)
        + f"\nInstall promtool (Debian: apt-get install {PACKAGE}) or put it at "
        f"{CACHE_DIR / 'promtool'}."
    )


def _fetch(path: Path) -> None:
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(
                f"promtool is not on PATH and this machine has no {tool} to fetch "
                f"Debian's {PACKAGE} package: install promtool (it ships with "
                f"Prometheus) or put it at {path}."
            )
    # The temp folder lives next to the cache so the final rename stays on one filesystem.
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=CACHE_DIR) as tmp:
        work = Path(tmp)
        deb = _download(work)
        unpacked = work / "root"
        subprocess.run(["dpkg", "-x", str(deb), str(unpacked)], check=True, timeout=300)
        staged = unpacked / "usr" / "bin" / "promtool"
        if not staged.is_file():
            raise RuntimeError(f"{deb.name} holds no usr/bin/promtool")
        staged.chmod(0o755)
        os.replace(staged, path)
