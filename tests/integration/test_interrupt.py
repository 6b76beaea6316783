"""Ctrl-C at any stage: deploykit stops its child processes (CMake, ninja, QEMU), prints one
line, exits 130, and leaves nothing a later build would trust; the same command then succeeds.

Each test runs deploykit as a real process and sends SIGINT to it alone (not to its process
group, which a terminal would do): deploykit must stop what it started by itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.lines import Lines
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [requires_toolchain, requires_cmake, requires_qemu]


def _deploykit(*args: str) -> list[str]:
    return [sys.executable, "-m", "deploykit", *args]


def _env() -> dict[str, str]:
    # CI=1: plain progress lines, one per step, which the test waits for.
    return {
        **os.environ,
        "CI": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")]),
    }


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (the test's own --out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(cmdline)
    return found


def _started(out: Path, program: str) -> Callable[[], bool]:
    """True once a process of `program` (cmake, qemu-system-arm) working on `out` runs: the
    stage is under way, not only announced."""
    return lambda: any(program in cmd for cmd in _processes_naming(str(out)))


def interrupt_when(
    cmd: list[str],
    stage: re.Pattern[str],
    out: Path,
    *,
    ready: Callable[[], bool] | None = None,
    limit_s: float = 600.0,
) -> str:
    """Run `cmd`, send SIGINT when a stderr line matches `stage` and then `ready()` holds, and
    check the ending: exit 130, one line saying so, no traceback, no process left. Returns
    stderr. Every wait has a deadline (tests/lines.py), so a deploykit that hangs fails here."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(), cwd=ROOT
    )
    assert proc.stderr is not None
    err = Lines(proc.stderr)
    deadline = time.monotonic() + limit_s
    try:
        err.wait_for(stage, limit_s)
        while ready is not None and not ready():
            assert time.monotonic() < deadline, f"the stage never got under way:\n{err.text}"
            assert proc.poll() is None, f"deploykit ended before the interrupt:\n{err.text}"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)
        rest = err.rest(60)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.text
    assert rc == 130, text
    assert "Traceback" not in text, text
    assert text.rstrip().splitlines()[-1] == "deploykit: interrupted", text
    assert rest.count("deploykit: interrupted") == 1, rest
    assert _processes_naming(str(out)) == []  # at once: nothing may outlive deploykit
    return text


def _succeeds(cmd: list[str]) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def test_interrupted_selftest_build_then_rebuild(tmp_path):
    out = tmp_path / "st"
    cmd = _deploykit("selftest", "--board", "qemu-an547", "--out", str(out))
    interrupt_when(cmd, re.compile(r"building firmware: \d+/"), out)
    assert "PASS" in _succeeds(cmd)


def test_interrupted_run_stops_qemu(tmp_path):
    out = tmp_path / "hang"
    cmd = _deploykit(
        "selftest",
        "--board",
        "qemu-an505",
        "--variant",
        "hang",
        "--timeout",
        "300",
        "--out",
        str(out),
    )
    interrupt_when(cmd, re.compile(r"running dk_selftest\.elf on qemu"), out,
                   ready=_started(out, "qemu-system-arm"))
    ok = _deploykit("selftest", "--board", "qemu-an505", "--out", str(out))
    assert "PASS" in _succeeds(ok)


def test_interrupted_export_leaves_no_export(tmp_path):
    out = tmp_path / "export"
    cmd = _deploykit("export", "--board", "qemu-an547", "--model", "tiny_cnn", "--out", str(out))
    # Once the export has begun writing its directory: there is something to clean up.
    interrupt_when(cmd, re.compile(r"exporting tiny_cnn"), out,
                   ready=(out / "export" / "export-native.log").exists)
    assert not (out / "export" / "model.pte").exists()
    assert not (out / "export" / "export.json").exists()
    _succeeds(cmd)
    assert (out / "export" / "export.json").is_file()


RUN_STAGES = {
    "configure": (re.compile(r"configuring firmware in"), "cmake"),
    "compile": (re.compile(r"building firmware: \d+/"), None),
    "fit": (re.compile(r"measuring on the target \(run 1\)"), None),
}


@requires_sources
@pytest.mark.parametrize("stage", list(RUN_STAGES))
def test_interrupted_run_then_rebuild(tmp_path, stage):
    out = tmp_path / stage
    pattern, program = RUN_STAGES[stage]
    cmd = _deploykit(
        "run",
        "--board",
        "qemu-an547",
        "--model",
        "tiny_cnn",
        "--out",
        str(out),
        *(["--fit"] if stage == "fit" else []),
    )
    interrupt_when(cmd, pattern, out, ready=_started(out, program) if program else None)
    if stage == "fit":
        assert not (out / "fit.json").exists()
    assert "PASS" in _succeeds(cmd)
