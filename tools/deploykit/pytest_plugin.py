"""pytest plugin: the same hardware-in-the-loop tests on QEMU, an FVP or a board.

    pytest tests/hil --board qemu-an547
    pytest tests/hil --board pico2 --dk-port /dev/ttyACM0
    pytest tests/hil --board pico2 --lg-place board=pico2     # a board on a labgrid farm

Option names: deploykit's own are `--board` and `--dk-*`; the farm's is `--lg-place`, beside
labgrid's own plugin options (`--lg-env`, `--lg-coordinator`, which gives the coordinator
here too, else $LG_COORDINATOR). None is one of pytest-embedded's (`--port`, `--target`, ...),
so the three plugins load together.

Fixtures:
- `board`: the parsed board file of `--board` (tests skip, with the reason, without it or
  when the board's simulator or device is absent);
- `deployed`: a factory. `deployed(model="tiny_cnn", flow=...)` builds the firmware, runs it
  on the board's runner and returns a `Deployment`; `deployed()` deploys the model of the
  project file (deploykit.toml) with its settings for the board (docs/project.md);
  `deployed(firmware="selftest")` does the same with the board self-test (`variant="fault"`
  or `"error"` fails on purpose). A
  `Deployment` has `.result` (the decoded records), `.report` (the parity report, for
  models), `.log_path`, and `.expect(what)`, which returns the first record of a type
  (`"done"`, `"tensor"`, ...) or the first log line matching a regex, and fails showing what
  was received and where the full log is.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploykit.readers.boards import Board, load_board
from deploykit.readers.protocol import RunRecords
from deploykit.util.errors import DeployKitError

_RECORD_TYPES = {"hello", "tensor", "timing", "memory", "error", "fault", "done", "log"}


class ExpectError(AssertionError):
    """What a test expected did not arrive; says what did and where the log is."""


@dataclass
class Deployment:
    board: Board
    result: RunRecords
    log_path: Path
    report: Any = None  # run_report.RunReport for models, selftest.SelftestReport for selftest

    def expect(self, what: str) -> Any:
        """The first record of type `what`, or the first log/console line matching regex `what`."""
        records = self.result
        if what in _RECORD_TYPES:
            found = [r for r in records.records if type(r).__name__.lower() == what
                     or (what == "error" and type(r).__name__ == "DeviceError")]
            if found:
                return found[0]
        else:
            pattern = re.compile(what)
            for log in records.logs:
                if pattern.search(log.text):
                    return log
            console = self.log_path.read_bytes().decode("utf-8", errors="replace") \
                if self.log_path.exists() else ""
            m = pattern.search(console)
            if m:
                return m.group(0)
        raise ExpectError(f"expected {what!r} from {self.board.name}, but the run ended without "
                          f"it.\nReceived: {records.summary()}\nFull console log: {self.log_path}")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("deploykit", "deploykit hardware-in-the-loop")
    group.addoption("--board", default=None,
                    help="board (boards/<name>.yaml) the HIL tests deploy to")
    group.addoption("--dk-port", default=None,
                    help="serial port or pyserial URL of the board (for physical boards)")
    group.addoption("--lg-place", default=None, metavar="NAME|TAG=VALUE",
                    help="take the board from a labgrid farm: this place, or any free place "
                    "with these tags (deploykit[farm]; coordinator: --lg-coordinator or "
                    "$LG_COORDINATOR)")
    group.addoption("--dk-timeout", type=float, default=120.0,
                    help="seconds a single run may take on the target (default 120)")


def _runner_options(config: pytest.Config) -> dict[str, Any]:
    """The runner options the command line gives: a local port, or a labgrid place (with the
    coordinator of labgrid's own plugin option when it is loaded)."""
    place = config.getoption("--lg-place")
    if not place:
        return {"port": config.getoption("--dk-port")}
    coordinator = None
    with contextlib.suppress(ValueError):  # labgrid's plugin is not loaded
        coordinator = config.getoption("--lg-coordinator")
    return {"port": config.getoption("--dk-port"), "place": place,
            "coordinator": coordinator}


@pytest.fixture(scope="session")
def board(request: pytest.FixtureRequest) -> Board:
    name = request.config.getoption("--board")
    if not name:
        pytest.skip("no target board: run with --board NAME (see `deploykit boards`)")
    try:
        b = load_board(name)
        from deploykit.pipeline.target import resolve_target

        resolved = resolve_target(b, runner_options=_runner_options(request.config))
        resolved.make_runner(None, lambda _m: None).check_environment()
    except DeployKitError as exc:
        pytest.skip(f"board {name} is not usable here: {exc.cause} {exc.hint}".strip())
    return b


@pytest.fixture
def deployed(board: Board, request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory):
    timeout = request.config.getoption("--dk-timeout")

    def deploy(model: str | None = None, *, flow: str | None = None,
               firmware: str = "runner", variant: str = "ok") -> Deployment:
        out = tmp_path_factory.mktemp(f"{board.name}-{model or firmware}-{variant}")
        try:
            if firmware == "selftest":
                from deploykit.pipeline.target import resolve_target
                from deploykit.run.selftest import run_selftest

                options = resolve_target(
                    board, runner_options=_runner_options(request.config)).runner_kwargs(
                    None, lambda _m: None)
                report = run_selftest(board, out, timeout, lambda _m: None, variant, options)
                records = report.records
            else:
                from deploykit import api
                from deploykit.pipeline.chains import run_firmware

                # The model and settings not given: the project file's for this board
                # (deploykit.toml from the current directory up, docs/project.md).
                cmd = api.command(board.path, model, runs=True, flow=flow,
                                  **_runner_options(request.config))
                report = run_firmware(cmd.target, str(cmd.model), out, None, timeout,
                                      lambda _m: None, inputs_dir=cmd.choices.value("inputs"),
                                      fit=bool(cmd.choices.value("fit")),
                                      tolerance=cmd.tolerance())
                records = report.records
        except DeployKitError as exc:
            if "sources not available" in exc.cause:
                pytest.skip(exc.cause)
            raise
        return Deployment(board, records, out / "run" / "console.bin", report)

    return deploy
