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
from pathlib import Path

import pytest

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


def interrupt_when(
    cmd: list[str],
    stage: re.Pattern[str],
    out: Path,
    *,
    delay_s: float = 0.0,
    limit_s: float = 600.0,
) -> str:
    """Run `cmd`, send SIGINT when a stderr line matches `stage` (after `delay_s`), and check
    the ending: exit 130, one line saying so, no traceback, no process left. Returns stderr."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT
    )
    assert proc.stderr is not None
    seen: list[str] = []
    deadline = time.monotonic() + limit_s
    try:
        for line in proc.stderr:
            seen.append(line)
            if stage.search(line):
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail(f"the stage {stage.pattern!r} never came:\n{''.join(seen)}")
        time.sleep(delay_s)
        os.kill(proc.pid, signal.SIGINT)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + rest
    assert rc == 130, err
    assert "Traceback" not in err, err
    assert err.rstrip().splitlines()[-1] == "deploykit: interrupted", err
    assert rest.count("deploykit: interrupted") == 1, rest
    assert _processes_naming(str(out)) == []  # at once: nothing may outlive deploykit
    return err


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
    interrupt_when(cmd, re.compile(r"running dk_selftest\.elf on qemu"), out, delay_s=1.0)
    ok = _deploykit("selftest", "--board", "qemu-an505", "--out", str(out))
    assert "PASS" in _succeeds(ok)


def test_interrupted_export_leaves_no_export(tmp_path):
    out = tmp_path / "export"
    cmd = _deploykit("export", "--board", "qemu-an547", "--model", "tiny_cnn", "--out", str(out))
    interrupt_when(cmd, re.compile(r"exporting tiny_cnn"), out, delay_s=1.5)
    assert not (out / "export" / "model.pte").exists()
    assert not (out / "export" / "export.json").exists()
    _succeeds(cmd)
    assert (out / "export" / "export.json").is_file()


RUN_STAGES = {
    "configure": (re.compile(r"configuring firmware in"), 0.5),
    "compile": (re.compile(r"building firmware: \d+/"), 0.0),
    "fit": (re.compile(r"measuring on the target \(run 1\)"), 0.0),
}


@requires_sources
@pytest.mark.parametrize("stage", list(RUN_STAGES))
def test_interrupted_run_then_rebuild(tmp_path, stage):
    out = tmp_path / stage
    pattern, delay = RUN_STAGES[stage]
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
    interrupt_when(cmd, pattern, out, delay_s=delay)
    if stage == "fit":
        assert not (out / "fit.json").exists()
    assert "PASS" in _succeeds(cmd)
