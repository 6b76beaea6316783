"""deploykit on a labgrid board farm, on loopback (tests/farm_lab.py says what is real).

A real labgrid-coordinator and labgrid-exporter on 127.0.0.1 publish two places, each a Pico 2
stand-in: its serial port served by ser2net, its BOOTSEL drive a directory. A run acquires a
place, copies the UF2 onto the place's drive, reads the result protocol over rfc2217 from the
firmware's own link code, and releases the place; contention and Ctrl-C leave no place held.
The full `deploykit run --place` (build included) needs the pico-sdk sources and skips
without them; the runs below it use a UF2 made here, so they need no sources.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from deploykit.readers.boards import load_board, repo_root
from deploykit.readers.uf2 import pages_to_uf2
from deploykit.util.errors import ExitCode

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("labgrid") is None,
        reason="labgrid is not installed: pip install 'deploykit[farm]' (scripts/install --farm)",
    ),
    pytest.mark.skipif(
        shutil.which("ser2net") is None and not Path("/usr/sbin/ser2net").exists(),
        reason="ser2net is not installed (apt-get install ser2net; scripts/install --farm)",
    ),
    pytest.mark.skipif(
        shutil.which("cc") is None and shutil.which("gcc") is None,
        reason="no host C compiler for the board stand-in (apt-get install gcc)",
    ),
]

PLACES = ["lab/pico2-3", "lab/pico2-4"]  # tagged board=pico2, flashed through their drive
PICOTOOL_PLACE = "lab/pico2-p"  # untagged, flashed with picotool
BLOCK_PLACE = "lab/pico2-b"  # untagged, its drive a block device (labgrid's own driver)

# One job of the contention test: a run through the farm in its own process, every progress
# line timestamped (wall clock, comparable across processes) into its log file.
JOB = r"""
import sys, time
from pathlib import Path
from deploykit.readers.boards import load_board
from deploykit.run.runners.serial_port import PicoRunner
query, coordinator, place_timeout, elf, out, log = sys.argv[1:7]
with open(log, "w", buffering=1) as f:
    def progress(message):
        f.write(f"{time.time():.6f} {message}\n")
    runner = PicoRunner({"kind": "pico"}, board=load_board("pico2"), place=query,
                        coordinator=coordinator, place_timeout=place_timeout, progress=progress)
    result = runner.run(Path(elf), Path(out), timeout_s=30, check=False)
    f.write(f"{time.time():.6f} RESULT {result.outcome().exit_code.name} "
            f"{result.records.tensors[0].data.ravel().tolist()}\n")
"""


@pytest.fixture(scope="module")
def standin_exe(tmp_path_factory) -> Path:
    from tests.farm_lab import build_standin

    return build_standin(tmp_path_factory.mktemp("farm-standin"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory, standin_exe):
    from tests.farm_lab import LocalFarm

    farm = LocalFarm(
        tmp_path_factory.mktemp("lab"),
        PLACES,
        standin_exe,
        picotool_place=PICOTOOL_PLACE,
        block_drive_place=BLOCK_PLACE,
    )
    yield farm
    farm.close()


@pytest.fixture
def farm(lab):
    """The module's farm (started once: about 8 s), with every place free and every board
    fresh in BOOTSEL mode."""
    lab.reset()
    return lab


@pytest.fixture
def image(tmp_path) -> Path:
    """A UF2 for the RP2350 (one page of code at the start of flash), and the ELF path the
    runner is given beside it; the stand-in checks the UF2's framing, not its code."""
    fw = tmp_path / "fw"
    fw.mkdir()
    page = bytes(range(256))
    (fw / "dk_runner.uf2").write_bytes(
        pages_to_uf2({0x10000000: page}, "rp2350-arm-s", abs_block=0x10FFFF00)
    )
    return fw / "dk_runner.elf"


def runner(farm, place: str, **kw):
    from deploykit.run.runners.serial_port import PicoRunner

    return PicoRunner(
        {"kind": "pico"}, board=load_board("pico2"), place=place, coordinator=farm.address, **kw
    )


@pytest.fixture(scope="module")
def coordinator_alone(tmp_path_factory):
    """A labgrid-coordinator on loopback with no exporter and no place (for the session's own
    failure paths)."""
    import socket

    from tests.farm_lab import _labgrid_tool, free_port

    root = tmp_path_factory.mktemp("coordinator")
    port = free_port()
    with open(root / "coordinator.log", "wb") as log:
        proc = subprocess.Popen(
            [_labgrid_tool("labgrid-coordinator"), "-l", f"127.0.0.1:{port}"],
            cwd=root, stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                assert proc.poll() is None, (root / "coordinator.log").read_text()
                assert time.monotonic() < deadline, "labgrid-coordinator did not listen"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_result_tag_that_cannot_be_set_is_said(coordinator_alone):
    """The coordinator refuses the tag (here: the place is gone): the run goes on, and says
    that `farm status` shows an older result."""
    from deploykit.run.farm.run import leave_result
    from deploykit.run.farm.session import FarmSession

    said: list[str] = []
    with FarmSession(coordinator_alone) as session:
        assert not leave_result(session, "lab/gone", "timeout", said.append)
    (line,) = said
    assert line.startswith(
        f"warning: could not tag lab/gone with dk_result=timeout on {coordinator_alone}: "
        "AioRpcError: Place lab/gone does not exist"
    ), line
    assert "older result" in line


def test_a_session_whose_stop_fails_still_closes_and_says_so(coordinator_alone, monkeypatch):
    """close() closes the channel also when stopping the update stream fails, and says what
    failed. The failure is injected into the real session: labgrid's stop() does not fail on
    demand (a coordinator that goes away is absorbed by labgrid's own stream task)."""
    from deploykit.run.farm.session import FarmSession

    said: list[str] = []
    session = FarmSession(coordinator_alone, warn=said.append)
    client = session._session
    real_close, closed = client.close, []

    async def broken_stop() -> None:
        raise RuntimeError("the update stream broke")

    async def close() -> None:
        closed.append(True)
        await real_close()

    monkeypatch.setattr(client, "stop", broken_stop)
    monkeypatch.setattr(client, "close", close)
    session.close()
    assert closed == [True]
    assert said == [
        f"the labgrid session with {coordinator_alone} did not end cleanly: stop() failed: "
        "RuntimeError: the update stream broke"
    ]


def test_a_run_goes_through_a_place(farm, image, tmp_path):
    farm.boards["lab/pico2-3"].values = np.linspace(-1, 1, 10, dtype=np.float32)
    lines = []
    res = runner(farm, "lab/pico2-3", progress=lines.append).run(
        image, tmp_path / "out", timeout_s=30, check=False
    )
    assert res.outcome().exit_code == ExitCode.OK, res.outcome()
    np.testing.assert_array_equal(
        res.records.tensors[0].data.ravel(), np.linspace(-1, 1, 10, dtype=np.float32)
    )
    assert res.runner.startswith("pico2 on rfc2217://127.0.0.1:")  # through ser2net
    flashes = farm.boards["lab/pico2-3"].flashes
    uf2 = image.with_suffix(".uf2").read_bytes()
    assert [(f.name, f.sha256) for f in flashes] == [
        ("dk_runner.uf2", hashlib.sha256(uf2).hexdigest())
    ]
    assert farm.boards["lab/pico2-3"].firmware_exit() == 0  # it got the host's ACK
    assert farm.boards["lab/pico2-4"].flashes == []
    assert any(line.startswith("acquired lab/pico2-3") for line in lines)
    assert farm.holders() == {p: None for p in farm.boards}
    assert "dk_result=ok" in farm.lg("-p", "lab/pico2-3", "show")


def test_a_running_board_is_rebooted_into_bootsel_through_the_place(farm, image, tmp_path):
    """After a run the board runs its image and has no drive; the next run sends the
    pico-sdk's 1200-baud touch over RFC 2217 (ser2net sets the port's line rate) and flashes
    once the drive is back."""
    board = farm.boards["lab/pico2-3"]
    first = runner(farm, "lab/pico2-3").run(image, tmp_path / "a", timeout_s=30, check=False)
    assert first.outcome().exit_code == ExitCode.OK
    assert not (board.drive / "INFO_UF2.TXT").exists()  # running, not in BOOTSEL mode
    lines: list[str] = []
    second = runner(farm, "lab/pico2-3", progress=lines.append).run(
        image, tmp_path / "b", timeout_s=30, check=False
    )
    assert second.outcome().exit_code == ExitCode.OK
    assert board.touches == 1 and len(board.flashes) == 2
    assert any("1200-baud touch on rfc2217://127.0.0.1:" in line for line in lines)
    assert farm.holders() == {p: None for p in farm.boards}


def test_a_place_with_a_boot_device_is_flashed_with_picotool(farm, image, tmp_path, monkeypatch):
    """picotool comes first in the board file's flashers: a place that exports the board's
    boot device (USBFlashableDevice) is flashed with `picotool load` at that device's USB bus
    and address, run on the exporter's host (here this one; bin/picotool stands in)."""
    monkeypatch.setenv("PATH", f"{farm.bin_dir}{os.pathsep}{os.environ['PATH']}")
    lines: list[str] = []
    res = runner(farm, PICOTOOL_PLACE, progress=lines.append).run(
        image, tmp_path / "out", timeout_s=30, check=False
    )
    assert res.outcome().exit_code == ExitCode.OK, res.outcome()
    uf2 = image.with_suffix(".uf2")
    call = farm.picotool_log.read_text().splitlines()[-1]
    assert call == f"load -v -x {uf2} -t uf2 --bus 3 --address 9"
    flashes = farm.boards[PICOTOOL_PLACE].flashes
    assert [f.sha256 for f in flashes] == [hashlib.sha256(uf2.read_bytes()).hexdigest()]
    assert any(
        f"with picotool through {PICOTOOL_PLACE}'s NetworkUSBFlashableDevice" in line
        for line in lines
    )
    assert farm.holders() == {p: None for p in farm.boards}


def test_farm_status_lists_places_boards_holders_and_last_results(farm, image, tmp_path, capsys):
    from deploykit.cli import main

    runner(farm, "lab/pico2-4").run(image, tmp_path / "out", timeout_s=30, check=False)
    farm.lg("-p", "lab/pico2-3", "acquire")
    holder = farm.holders()["lab/pico2-3"]
    assert main(["farm", "status", "--coordinator", farm.address, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    places = {p["name"]: p for p in status["places"]}
    assert places["lab/pico2-3"]["holder"] == holder
    assert places["lab/pico2-4"]["holder"] is None
    assert places["lab/pico2-4"]["tags"] == {"board": "pico2", "dk_result": "ok"}
    assert main(["farm", "status", "--coordinator", farm.address]) == 0
    text = capsys.readouterr().out
    assert f"lab/pico2-3              pico2        {holder}" in text
    assert "lab/pico2-4              pico2        free" in text


def test_a_block_device_drive_goes_to_labgrids_storage_driver(farm, image, tmp_path):
    """A drive exported as a block device (what udev gives a real BOOTSEL drive) is written by
    labgrid's USBStorageDriver, built from the held place as labgrid-client builds it. It
    reaches the exporter over SSH, which this machine does not serve: the run fails there,
    naming the drive, and the place is released."""
    from deploykit.run.flashers import FlashError

    with pytest.raises(FlashError) as err:
        runner(farm, BLOCK_PLACE).run(image, tmp_path / "out", timeout_s=30)
    assert "to the drive /dev/disk/by-id/usb-RPI_RP2350-deploykit-test on 127.0.0.1" in (
        err.value.cause
    )
    assert type(err.value.__cause__).__module__.startswith("labgrid")
    assert farm.holders() == {p: None for p in farm.boards}
    assert "dk_result=flash" in farm.lg("-p", BLOCK_PLACE, "show")


def test_a_tag_query_takes_a_free_place(farm, image, tmp_path):
    farm.lg("-p", "lab/pico2-3", "acquire")  # someone else's job holds the first place
    res = runner(farm, "board=pico2").run(image, tmp_path / "out", timeout_s=30, check=False)
    assert res.outcome().exit_code == ExitCode.OK
    assert farm.boards["lab/pico2-3"].flashes == []
    assert len(farm.boards["lab/pico2-4"].flashes) == 1
    holders = farm.holders()
    assert holders["lab/pico2-3"] is not None and holders["lab/pico2-4"] is None


def test_a_busy_place_times_out_naming_its_holder(farm, image, tmp_path):
    from deploykit.run.farm.session import FarmError

    farm.lg("-p", "lab/pico2-3", "acquire")
    holder = farm.holders()["lab/pico2-3"]
    t0 = time.monotonic()
    with pytest.raises(FarmError) as err:
        runner(farm, "lab/pico2-3", place_timeout=1.5).run(image, tmp_path / "out")
    # It gave up at its own place timeout, not the default 300 s: the upper bound leaves room
    # for the session's start on a loaded machine (load average 8 on two cores).
    assert 1.5 <= time.monotonic() - t0 < 60
    assert "within 1.5 s" in err.value.cause
    assert f"lab/pico2-3 held by {holder}" in err.value.cause
    assert farm.boards["lab/pico2-3"].flashes == []


def test_unknown_place_and_no_coordinator_are_clear_errors(farm, image, tmp_path, monkeypatch):
    from deploykit.run.farm.session import FarmError

    with pytest.raises(FarmError, match="has no place lab/pico2-9") as err:
        runner(farm, "lab/pico2-9").run(image, tmp_path / "out")
    assert "lab/pico2-3 (pico2)" in err.value.hint
    monkeypatch.delenv("LG_COORDINATOR", raising=False)
    from deploykit.run.runners.serial_port import PicoRunner

    with pytest.raises(FarmError, match="No labgrid coordinator"):
        PicoRunner({"kind": "pico"}, board=load_board("pico2"), place="lab/pico2-3").run(
            image, tmp_path / "out"
        )


def test_the_pytest_plugin_takes_its_board_from_a_place(farm, tmp_path):
    """`pytest --board pico2 --lg-place ...`: the board fixture is usable because the farm has
    such a place (labgrid's own plugin gives --lg-coordinator); a place it lacks skips with
    the reason."""
    test = tmp_path / "test_target.py"
    test.write_text("def test_target(board):\n    assert board.name == 'pico2'\n")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        str(test),
        "--board",
        "pico2",
        "--lg-coordinator",
        farm.address,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo_root() / "tools")}
    found = subprocess.run(
        [*cmd, "--lg-place", "board=pico2"], capture_output=True, text=True, env=env, timeout=120
    )
    assert "1 passed" in found.stdout, found.stdout + found.stderr
    missing = subprocess.run(
        [*cmd, "--lg-place", "lab/pico2-9"], capture_output=True, text=True, env=env, timeout=120
    )
    assert "1 skipped" in missing.stdout and "has no place lab/pico2-9" in missing.stdout


def _hold_intervals(logs: list[Path]) -> dict[str, list[tuple[float, float, str]]]:
    """Per place, the (acquired, releasing) times of every job that held it: both are written
    while the job holds the place, so holds that overlap in time show here as overlapping."""
    held: dict[str, list[tuple[float, float, str]]] = {}
    for log in logs:
        start: dict[str, float] = {}
        for line in log.read_text().splitlines():
            stamp, _, message = line.partition(" ")
            words = message.split()
            if message.startswith("acquired "):
                start[words[1]] = float(stamp)
            elif message.startswith("releasing "):
                held.setdefault(words[1], []).append((start.pop(words[1]), float(stamp), log.name))
    return held


def test_contention_two_places_four_runs_and_a_ctrl_c(farm, image, tmp_path):
    for board in farm.boards.values():
        board.values = np.full(10, 0.25, dtype=np.float32)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(repo_root() / "tools"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    jobs, logs = [], []
    for i in range(4):
        log = tmp_path / f"job{i}.log"
        logs.append(log)
        jobs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    "board=pico2",
                    farm.address,
                    "60",
                    str(image),
                    str(tmp_path / f"out{i}"),
                    str(log),
                ],
                env={**env, "LG_USERNAME": f"job{i}"},
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    # Ctrl-C for job 0 as soon as it holds a place.
    deadline = time.monotonic() + 60
    while not (logs[0].exists() and "acquired " in logs[0].read_text()):
        assert time.monotonic() < deadline, "job 0 never acquired a place"
        assert jobs[0].poll() is None, jobs[0].stderr.read()
        time.sleep(0.02)
    jobs[0].send_signal(signal.SIGINT)
    codes = [j.wait(120) for j in jobs]
    errors = [j.stderr.read() for j in jobs]
    assert codes[0] != 0 and "KeyboardInterrupt" in errors[0]
    assert "releasing " in logs[0].read_text()  # the interrupted job let its place go
    for i in (1, 2, 3):
        assert codes[i] == 0, errors[i]
        assert "RESULT OK [0.25, 0.25" in logs[i].read_text()
    held = _hold_intervals(logs)
    assert sum(len(v) for v in held.values()) == 4
    for place, intervals in held.items():
        intervals.sort()
        for (_s0, end0, job0), (start1, _e1, job1) in zip(intervals, intervals[1:], strict=False):
            assert end0 <= start1, f"{place} held by {job0} and {job1} at once"
    assert sum(len(b.flashes) for b in farm.boards.values()) >= 3
    # Each run after a place's first found its board running and rebooted it into BOOTSEL.
    assert sum(b.touches for b in farm.boards.values()) >= 1
    assert farm.holders() == {p: None for p in farm.boards}


@pytest.mark.sources
@pytest.mark.timeout(2400)  # a cold pico-sdk and runtime build first, beyond the default limit
def test_deploykit_run_place_builds_flashes_reads_and_compares(farm, tmp_path):
    """The whole command on the farm: export, build (pico-sdk), acquire, flash, read, compare,
    release. The stand-in answers with the export's own reference outputs, then with outputs
    off by 0.5, which the comparison must catch."""
    from deploykit.readers.sources import load_workspace
    from deploykit.util.errors import DeployKitError

    try:
        ws = load_workspace(None)
    except DeployKitError as exc:
        pytest.skip(f"needs the ExecuTorch and pico-sdk sources: {exc.cause}")
    if not (ws.has("pico-sdk") and ws.has("executorch")):
        pytest.skip("needs the pico-sdk sources in the workspace (deploykit setup --group pico)")
    out = tmp_path / "build"

    def reference() -> np.ndarray:
        return np.load(out / "export" / "reference.npz")["output_0"].ravel()

    board = farm.boards["lab/pico2-3"]
    cmd = [
        sys.executable,
        "-m",
        "deploykit",
        "--json",
        "run",
        "--board",
        "pico2",
        "--model",
        "mlp_mnist",
        "--out",
        str(out),
        "--place",
        "lab/pico2-3",
        "--coordinator",
        farm.address,
        "--timeout",
        "30",
    ]
    env = {**os.environ, "PYTHONPATH": str(repo_root() / "tools")}
    board.values = reference
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["passed"] is True
    assert len(board.flashes) == 1
    assert (
        board.flashes[0].sha256
        == hashlib.sha256((out / "firmware" / "dk_runner.uf2").read_bytes()).hexdigest()
    )
    board.values = lambda: reference() + 0.5
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == ExitCode.MISMATCH, res.stderr[-3000:]
    assert farm.holders() == {p: None for p in farm.boards}
