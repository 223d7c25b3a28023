"""The tests do not depend on the caller's environment: the service's variables set
where pytest was started (``RABBITMQ_URL=... make test-unit``) reach neither the
code under test in this process nor a child process of it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.process import ROOT, SERVICE_VARIABLES, child_env

# Where a variable is read: ``environ.get("X")``, ``environ["X"]``,
# ``_required(environ, "X")``, and the overrides table's ``("X", "section", "key")``.
_READS = (
    re.compile(r'environ(?:\.get\(|\[)\s*"([A-Za-z_][A-Za-z0-9_]*)"'),
    re.compile(r'_required\(\s*environ,\s*"([A-Z_][A-Z0-9_]*)"'),
    re.compile(r'\(\s*"([A-Z_][A-Z0-9_]*)",\s*"[a-z_]+",\s*"[a-z_]+"\s*\)'),
)
# Spark's own variables, for the batch side under Spark (the ``spark`` marker's tests).
_NOT_THE_SERVICE = {"dispatcher/pipeline/spark.py"}


def variables_read() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "dispatcher").rglob("*.py")):
        where = path.relative_to(ROOT).as_posix()
        if where in _NOT_THE_SERVICE:
            continue
        text = path.read_text()
        for pattern in _READS:
            for name in pattern.findall(text):
                found.setdefault(name, set()).add(where)
    return found


def test_every_variable_the_service_reads_is_kept_from_the_tests() -> None:
    found = variables_read()
    # The scan finds the known readers (else it would pass on finding nothing).
    assert {"RABBITMQ_URL", "DISPATCHER_CONFIG", "QUEUE_NAME", "NO_PROXY"} <= set(found)
    missing = {
        name: sorted(files) for name, files in found.items() if name not in SERVICE_VARIABLES
    }
    assert not missing, f"add to tests/support/process.py SERVICE_VARIABLES: {missing}"


def test_this_process_has_none_of_them() -> None:
    """tests/conftest.py removed them before any test ran."""
    assert not SERVICE_VARIABLES & set(os.environ)


def test_a_child_gets_a_clean_base(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SERVICE_VARIABLES:
        monkeypatch.setenv(name, "from-the-caller")
    monkeypatch.setenv("SOME_TOOL_SETTING", "from-the-caller")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    env = child_env({"LOG_LEVEL": "debug"})
    assert env["PATH"] == "/usr/bin:/bin"
    assert env["PYTHONPATH"] == str(ROOT)
    assert env["LOG_LEVEL"] == "debug"  # what the test asks for, and only that
    assert "SOME_TOOL_SETTING" not in env
    assert not (SERVICE_VARIABLES - {"LOG_LEVEL"}) & set(env)
    assert Path(env["PYTHONPATH"], "dispatcher").is_dir()
