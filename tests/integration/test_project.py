"""The project file with sources: the headline command as the project describes it, and a new
project from `deploykit init` running on QEMU and under pytest (docs/project.md).

Each command runs as a user runs it, in a subprocess from the project's directory, with a
timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.markers import (
    requires_cmake,
    requires_ethos_u_sources,
    requires_qemu,
    requires_sources,
    requires_toolchain,
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = [requires_toolchain, requires_cmake, requires_sources]


def _deploykit(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deploykit", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@requires_ethos_u_sources
def test_the_headline_command_builds_the_project_model(tmp_path):
    """`deploykit build --board corstone-320`, exactly as the README gives it: MobileNetV2 (the
    repository's deploykit.toml) through the board's ethos_u_int8 flow. --out keeps the clone's
    build/ alone; nothing else is given."""
    res = _deploykit("build", "--board", "corstone-320", "--out", str(tmp_path / "headline"),
                     cwd=REPO, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "mobilenet_v2" in res.stdout and "ethos_u_int8" in res.stdout
    assert (tmp_path / "headline" / "firmware" / "dk_runner.elf").is_file()


@requires_qemu
def test_init_then_run_and_pytest_on_qemu(tmp_path):
    project = tmp_path / "my-project"
    assert _deploykit("init", str(project), cwd=tmp_path, timeout=60).returncode == 0
    res = _deploykit("run", "--board", "qemu-an547", cwd=project, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "model (portable_fp32) on qemu-an547: PASS" in res.stdout
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO / "tools"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    res = subprocess.run([sys.executable, "-m", "pytest", "--board", "qemu-an547", "-q",
                          "-p", "no:cacheprovider"], cwd=project, capture_output=True,
                         text=True, timeout=1200, env=env)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "1 passed" in res.stdout
