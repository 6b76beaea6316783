"""Two deploykit commands at once, as real processes: on the same --out the second waits for
the first, saying so, and never interleaves with it; two cold builds of the same ExecuTorch
runtime-cache key build it once, the second waiting for the first and reusing its runtime."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [requires_toolchain, requires_cmake]


def _env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "CI": "1",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")]),
        **extra,
    }


class Timed:
    """A deploykit process whose stderr lines are kept with the time each arrived."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploykit", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or _env(),
            cwd=ROOT,
        )
        self.lines: list[tuple[float, str]] = []

    def wait_for(self, pattern: str, limit_s: float = 300) -> float:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + limit_s
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))
            if re.search(pattern, line):
                return self.lines[-1][0]
            assert time.monotonic() < deadline
        raise AssertionError(f"{pattern!r} never came: {self.text}")

    def finish(self, limit_s: float = 900) -> tuple[int, float]:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line))
        rc = self.proc.wait(timeout=limit_s)
        return rc, time.monotonic()

    @property
    def text(self) -> str:
        return "".join(line for _, line in self.lines)


@requires_qemu
def test_second_command_on_the_same_out_waits_and_does_not_interleave(tmp_path):
    out = tmp_path / "shared"
    first = Timed(
        "selftest",
        "--board",
        "qemu-an547",
        "--variant",
        "hang",
        "--timeout",
        "4",
        "--out",
        str(out),
    )
    first.wait_for(r"running dk_selftest\.elf on qemu")
    second = Timed("selftest", "--board", "qemu-an547", "--out", str(out))
    waiting_at = second.wait_for(r"deploykit: waiting for ")
    assert f"pid {first.proc.pid} (selftest" in second.text and str(out) in second.text
    rc1, first_done = first.finish()
    started_at = second.wait_for(r"building the selftest firmware")
    rc2, _ = second.finish()
    assert (rc1, rc2) == (0, 0), first.text + second.text
    # The second did nothing before the first was over.
    assert waiting_at < first_done <= started_at + 0.5


@requires_sources
def test_two_cold_builds_of_one_runtime_key_build_it_once(tmp_path):
    from deploykit.readers.sources import load_workspace

    # A workspace of the same sources with an empty runtime cache: both builds are cold.
    ws_src = load_workspace().root
    ws = tmp_path / "ws"
    ws.mkdir()
    for entry in ws_src.iterdir():
        if entry.name != "runtime-cache":
            (ws / entry.name).symlink_to(entry)
    env = _env(DEPLOYKIT_WORKSPACE=str(ws))
    builds = [
        Timed(
            "build",
            "--board",
            "qemu-an547",
            "--model",
            "tiny_cnn",
            "--out",
            str(tmp_path / f"out{i}"),
            env=env,
        )
        for i in range(2)
    ]
    results = [b.finish(limit_s=1800) for b in builds]
    assert [rc for rc, _ in results] == [0, 0], builds[0].text + builds[1].text
    (runtime,) = [d for d in (ws / "runtime-cache").iterdir() if d.name.startswith("et")]
    # Every object and library of the runtime was built once, by one of the two builds (each
    # ninja run also re-checks CMake's globs, CMakeFiles/cmake.verify_globs: not a build).
    log = (runtime / ".ninja_log").read_text().splitlines()
    outputs = [line.split("\t")[3] for line in log if not line.startswith("#")]
    outputs = [o for o in outputs if o.endswith((".obj", ".a"))]
    assert outputs and len(outputs) == len(set(outputs)), [
        o for o in outputs if outputs.count(o) > 1
    ][:5]
    configured = [
        b
        for b in range(2)
        if "ExecuTorch runtime: configuring"
        in (tmp_path / f"out{b}" / "firmware" / "build.log").read_text()
    ]
    assert len(configured) == 1, configured
