"""The linux_aarch64 family's pieces that need no sources: the runtime cache key, the runner's
commands (qemu-aarch64 and SSH) and options, and the board-file fields it added."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from deploykit.families import family_of
from deploykit.families.linux_runtime import runtime_key
from deploykit.readers.boards import board_from_dict, load_board
from deploykit.run.report import RunReport, report_json
from deploykit.run.runners import runner_class, runner_for_board
from deploykit.run.runners.linux import LinuxRunner
from deploykit.util.errors import ConfigError, ExitCode

COMMITS = {"executorch": "e4d02f41", "xnnpack": "1adaa7c7"}


@pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-g++") is None,
    reason="aarch64-linux-gnu-g++ not installed (apt-get install g++-aarch64-linux-gnu)",
)
def test_runtime_key_is_per_cpu_flags_and_sources():
    pi5 = runtime_key(load_board("rpi5").cpu_flags, COMMITS)
    pi4 = runtime_key(load_board("rpi4").cpu_flags, COMMITS)
    assert pi5 == runtime_key(load_board("rpi5").cpu_flags, dict(COMMITS))  # stable
    assert pi5[0] != pi4[0]
    assert pi5[0] != runtime_key(load_board("rpi5").cpu_flags, {**COMMITS, "xnnpack": "0" * 8})[0]
    assert "cpu_flags=-march=armv8.2-a+dotprod+fp16 -mtune=cortex-a76" in pi5[1]
    assert "aarch64-linux-gnu-" in pi5[1]  # the compiler and its version


def test_runner_under_qemu_user(tmp_path):
    runner = runner_for_board(load_board("rpi5"))
    assert isinstance(runner, LinuxRunner) and runner.threads == 4
    elf = tmp_path / "dk_runner.elf"
    elf.write_bytes(b"\x7fELF")
    assert runner.command(elf) == ["qemu-aarch64", "-cpu", "cortex-a76", str(elf)]
    assert runner_for_board(load_board("rpi4")).command(elf)[2] == "cortex-a72"


def test_runner_over_ssh(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYKIT_SSH_CONFIG", "/cfg")
    monkeypatch.setenv("DEPLOYKIT_REMOTE_EXEC", "qemu-aarch64")
    runner = runner_for_board(load_board("rpi5"), host="pi5", threads="2")
    elf = tmp_path / "dk_runner.elf"
    elf.write_bytes(b"\x7fELF one")
    cmd = runner.command(elf)
    assert cmd[:3] == ["ssh", "-F", "/cfg"] and "BatchMode=yes" in cmd
    assert cmd[-2] == "pi5"
    assert cmd[-1].startswith("DK_THREADS=2 qemu-aarch64 /tmp/deploykit/dk_runner-")
    other = tmp_path / "other.elf"
    other.write_bytes(b"\x7fELF two")
    assert runner.remote_path(elf) != runner.remote_path(other)  # named by content


def test_emulated_time_is_named(monkeypatch):
    """Under qemu-user, here or behind DEPLOYKIT_REMOTE_EXEC on the remote, the runner's execute
    ticks are emulated time: the runner says what emulated them; on a real board it does not."""
    monkeypatch.delenv("DEPLOYKIT_REMOTE_EXEC", raising=False)
    local = runner_for_board(load_board("rpi5"))
    assert local.emulated_by == "qemu-aarch64 -cpu cortex-a76, qemu-user on this machine"
    assert runner_for_board(load_board("rpi5"), host="pi5").emulated_by is None
    monkeypatch.setenv("DEPLOYKIT_REMOTE_EXEC", "/usr/bin/qemu-aarch64 -cpu cortex-a76")
    emulated = runner_for_board(load_board("rpi5"), host="pi5").emulated_by
    assert emulated == "/usr/bin/qemu-aarch64 -cpu cortex-a76 on pi5"
    monkeypatch.setenv("DEPLOYKIT_REMOTE_EXEC", "nice -n 5")
    assert runner_for_board(load_board("rpi5"), host="pi5").emulated_by is None


def test_run_report_says_emulated_time():
    report = RunReport(
        board="rpi5",
        model="tiny_cnn",
        flow="xnnpack_fp32",
        passed=True,
        exit_code=ExitCode.OK,
        verdict=None,
        reference_kind="executorch",
        ticks=1_000_000,
        tick_hz=1_000_000_000,
        timing_emulated_by="qemu-aarch64 -cpu cortex-a76, qemu-user on this machine",
    )
    lines = report.summary().splitlines()
    at = next(i for i, line in enumerate(lines) if "execute: 1,000,000 ticks" in line)
    assert lines[at + 1] == (
        "  execute time is emulated (qemu-aarch64 -cpu cortex-a76, qemu-user on this machine): "
        "no measurement of the board"
    )
    assert report_json(report)["timing_emulated_by"].startswith("qemu-aarch64")
    report.timing_emulated_by = None
    assert "emulated" not in report.summary()


def test_runner_options_are_checked():
    cls = runner_class(load_board("rpi5"))
    assert cls.check_options("rpi5", {"host": "pi", "threads": None}) == {"host": "pi"}
    with pytest.raises(ConfigError, match="--port is not an option of the linux runner"):
        cls.check_options("rpi5", {"port": "/dev/ttyACM0"})
    with pytest.raises(ConfigError, match="not a thread count"):
        runner_for_board(load_board("rpi5"), threads="many")
    # and a Cortex-M board's runner does not take --host
    with pytest.raises(ConfigError, match="--host is not an option of the qemu runner"):
        runner_class(load_board("qemu-an547")).check_options("qemu-an547", {"host": "pi"})


def test_board_file_fields(tmp_path):
    board = load_board("rpi5")
    assert family_of(board).name == "linux_aarch64"
    data = yaml.safe_load(Path(board.path).read_text())
    # a UART console still needs its address; stdout needs none
    bad = {**data, "console": {"kind": "cmsdk-uart"}}
    with pytest.raises(ConfigError, match="base"):
        board_from_dict(bad, tmp_path / "rpi5.yaml")
    no_linux = {k: v for k, v in data.items() if k != "linux"}
    with pytest.raises(ConfigError, match="no `linux:` section"):
        family_of(board_from_dict(no_linux, tmp_path / "rpi5.yaml"))


@pytest.fixture
def commands(monkeypatch) -> list[list[str]]:
    """The aarch64 runtime build's commands, recorded instead of run (a real build compiles
    XNNPACK for minutes; tests/integration/test_rpi5_run.py does it), with its tools and
    compiler version taken as present."""
    import deploykit.families.linux_runtime as lr

    recorded: list[list[str]] = []
    monkeypatch.setattr(lr, "require_tools", lambda *names: None)
    monkeypatch.setattr(lr, "_compiler_version", lambda prefix: "12.2.0")
    monkeypatch.setattr(lr, "_run_logged", lambda cmd, *args, **kw: recorded.append(cmd))
    return recorded


@pytest.mark.timeout(60)
def test_runtime_is_configured_from_its_own_toolchain_copy(tmp_path, commands):
    """The aarch64 runtime's key hashes the toolchain file's content, so checkouts share its
    directory: it is configured with a copy of the toolchain file kept in the directory, never
    the checkout's (CMake records that path in the build directory). An unfinished build
    configured from another path starts over. The commands are recorded, not run."""
    import deploykit.families.linux_runtime as lr

    cache = tmp_path / "runtime-cache"
    key, _ = lr.runtime_key(["-mcpu=cortex-a76"], COMMITS)
    directory = cache / f"linux-aarch64-{key}"
    # What an older deploykit left: an unfinished build configured from its checkout.
    stale = directory / "build" / "CMakeCache.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("CMAKE_TOOLCHAIN_FILE:FILEPATH=/elsewhere/cmake/aarch64-linux-gnu.cmake\n")
    runtime = lr.build_runtime(tmp_path / "executorch", cache, ["-mcpu=cortex-a76"], COMMITS)
    assert runtime.directory == directory and not runtime.cached
    assert not stale.exists()
    copy = directory / "toolchain" / "aarch64-linux-gnu.cmake"
    assert copy.read_bytes() == lr.toolchain_file().read_bytes()
    configure = commands[0]
    assert f"-DCMAKE_TOOLCHAIN_FILE={copy}" in configure
    assert not any(str(lr.toolchain_file().parent) in arg for arg in configure), configure
    assert runtime_key(["-mcpu=cortex-a76"], COMMITS)[1].count("toolchain=") == 1
    assert str(lr.toolchain_file()) not in lr.runtime_key(["-mcpu=cortex-a76"], COMMITS)[1]


HOLDER = """
import sys
from pathlib import Path
from deploykit.util.locks import file_lock
directory = Path(sys.argv[1])
with file_lock(directory / ".dk-build.lock", str(directory)):
    print("HELD", flush=True)
    sys.stdin.readline()  # until the other build says it waits
    (directory / "dk-runtime-installed.json").write_text('{"key": "k", "seconds": 1.0}')
"""


@pytest.mark.timeout(60)
def test_a_second_build_of_one_key_waits_and_takes_the_first(tmp_path, commands):
    """Two builds of one aarch64 runtime key (two boards with the same CPU flags): the second
    waits for the first's lock, says so, and then finds the runtime installed instead of
    configuring the directory again. The other build is a real process holding the lock."""
    import deploykit.families.linux_runtime as lr

    cache = tmp_path / "runtime-cache"
    key, _ = lr.runtime_key(["-mcpu=cortex-a76"], COMMITS)
    directory = cache / f"linux-aarch64-{key}"
    directory.mkdir(parents=True)
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={"PYTHONPATH": str(root / "tools")})
    assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
    said: list[str] = []
    waiting = threading.Event()

    def progress(message: str) -> None:
        said.append(message)
        waiting.set()

    result: list = []
    build = threading.Thread(target=lambda: result.append(lr.build_runtime(
        tmp_path / "executorch", cache, ["-mcpu=cortex-a76"], COMMITS, progress=progress)))
    build.start()
    assert waiting.wait(timeout=30), "the second build did not say it waits"
    holder.communicate("go\n", timeout=30)  # the first build finishes and releases its lock
    build.join(timeout=30)
    assert holder.returncode == 0 and not build.is_alive()
    (runtime,) = result
    assert runtime.cached and runtime.directory == directory
    assert commands == []
    assert any(m.startswith("waiting for pid ") and str(directory) in m for m in said), said
