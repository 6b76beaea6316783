"""Two deploykit commands at once, as real processes: on the same --out the second waits for
the first, saying so, and never interleaves with it; two cold builds of the same ExecuTorch
runtime-cache key build it once, the second waiting for the first and reusing its runtime."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lines import Lines
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


# deploykit's CLI with every line it writes to stderr stamped with the time it wrote it (its
# own time.monotonic(), a system-wide clock comparable across processes). Times taken as the
# test reads the lines would say when the test got round to reading them, not when the
# process did something.
STAMPED = """
import sys, time

class Stamped:
    def __init__(self, stream):
        self.stream, self.at_line_start = stream, True

    def write(self, text):
        out = []
        for piece in text.splitlines(keepends=True):
            if self.at_line_start:
                out.append(f"{time.monotonic():.6f} ")
            out.append(piece)
            self.at_line_start = piece.endswith("\\n")
        return self.stream.write("".join(out))

    def __getattr__(self, name):
        return getattr(self.stream, name)

sys.stderr = Stamped(sys.stderr)
from deploykit.cli import main
sys.exit(main())
"""


class Stamped:
    """A deploykit process whose stderr lines carry the time the process wrote them."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", STAMPED, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or _env(),
            cwd=ROOT,
        )
        assert self.proc.stderr is not None
        self.err = Lines(self.proc.stderr)

    def wait_for(self, pattern: str, limit_s: float = 300) -> float:
        """The time the process wrote the first line matching `pattern`."""
        return self.stamp(self.err.wait_for(pattern, limit_s))

    def lines_after(self, pattern: str) -> list[str]:
        """The lines the process wrote after the first one matching `pattern` (so far)."""
        lines = [line for _, line in self.err.seen]
        first = next(i for i, line in enumerate(lines) if re.search(pattern, line))
        return lines[first + 1 :]

    def finish(self, limit_s: float = 900) -> int:
        self.err.rest(limit_s)
        return self.proc.wait(timeout=60)

    @staticmethod
    def stamp(line: str) -> float:
        return float(line.split(" ", 1)[0])

    @property
    def text(self) -> str:
        return self.err.text


def _blocked_on_flock(path: Path, pid: int) -> bool:
    """Whether process `pid` waits in flock() for the lock on `path`: the kernel lists a
    waiting request in /proc/locks as "N: -> FLOCK ADVISORY WRITE <pid> <maj:min:inode> ..."."""
    inode = path.stat().st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if (len(f) > 6 and f[1] == "->" and f[2] == "FLOCK" and int(f[5]) == pid
                and int(f[6].rsplit(":", 1)[1]) == inode):
            return True
    return False


@requires_qemu
def test_second_command_on_the_same_out_waits_and_does_not_interleave(tmp_path):
    from deploykit.util.locks import LOCK_NAME

    out = tmp_path / "shared"
    # The first holds the directory until the test lets it go (a hang with a long limit,
    # then Ctrl-C): no race against a time limit however slow the machine.
    first = Stamped(
        "selftest", "--board", "qemu-an547", "--variant", "hang", "--timeout", "600",
        "--out", str(out),
    )
    second = None
    try:
        first.wait_for(r"running dk_selftest\.elf on qemu")
        second = Stamped("selftest", "--board", "qemu-an547", "--out", str(out))
        second.wait_for(r"deploykit: waiting for ")
        assert f"pid {first.proc.pid} (selftest" in second.text and str(out) in second.text
        # Seen while the first still holds the lock: the second is blocked in flock() on it,
        # and has written nothing since it said it waits.
        deadline = time.monotonic() + 60
        while not _blocked_on_flock(out / LOCK_NAME, second.proc.pid):
            assert time.monotonic() < deadline, "the second never waited in flock()"
            assert second.proc.poll() is None, second.text
            time.sleep(0.02)
        assert first.proc.poll() is None, first.text
        assert second.lines_after(r"deploykit: waiting for ") == []
        released = time.monotonic()  # the first cannot let go before it is interrupted
        os.kill(first.proc.pid, signal.SIGINT)
        rc1 = first.finish(limit_s=120)
        started_at = second.wait_for(r"building the selftest firmware")
        rc2 = second.finish()
    finally:
        for p in (first, second):
            if p is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
    assert (rc1, rc2) == (130, 0), first.text + second.text
    assert "deploykit: interrupted" in first.text
    # The second did nothing before the first was over (its own time of writing the line).
    assert started_at > released, (started_at, released)


@requires_sources
@pytest.mark.timeout(2400)  # two cold runtime builds on shared cores, beyond the default limit
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
        Stamped(
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
    assert results == [0, 0], builds[0].text + builds[1].text
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
