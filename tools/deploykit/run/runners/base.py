"""The Runner interface: start the firmware somewhere, feed its console to the protocol decoder.

A runner declares what it can do as class attributes (like Zephyr's runner capabilities), so
the pipeline can ask before it relies on a feature:

- `supports_exit_code`: the target's process exit code mirrors `done.status` (simulators with
  semihosting); a disagreement is then a protocol error.
- `supports_icount`: instruction counts are deterministic and can be derived from ticks.
- `is_simulator`: nothing physical is flashed.
- `supports_stream`: `open_stream` starts serve firmware and hands a two-way link to it to a
  serve session (run/stream.py: samples streamed to the device, issue #28).

It also declares the command-line options it takes (`options`, like a west runner's
`add_parser`): the CLI offers the options of every runner, and a run passes a runner only the
ones it declares; giving another board's option is an error, never silently ignored.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from deploykit.readers.protocol import DecodeStats, Outcome, RunRecords
from deploykit.run.stream import StreamLink
from deploykit.util.errors import ConfigError, ExitCode, RunError

if TYPE_CHECKING:
    from deploykit.readers.execute_failure import LocatedFailure

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class RunnerOption:
    """A command-line option a runner takes (`deploykit run` and `flash`)."""

    flag: str  # "--port"
    dest: str  # the keyword the runner's constructor takes: "port"
    metavar: str
    help: str


@dataclass
class RunResult:
    """What one run produced. `outcome()` classifies it; `check()` raises when it failed."""

    records: RunRecords
    exit_code: int | None  # the target's exit code; None when it was killed or has none
    wall_seconds: float
    console_log: Path  # raw console bytes, exactly as received
    runner_log: Path | None  # the runner's own output (QEMU's stdout/stderr)
    runner: str = ""
    supports_exit_code: bool = False
    timed_out: bool = False  # the host-side timeout expired before `done`
    timeout_s: float | None = None
    killed: bool = False  # the host had to kill the target process
    icount_shift: int | None = None  # QEMU -icount shift, None when icount was off
    instructions_estimate: float | None = None  # from timing ticks under icount; an estimate
    command: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    hang: str | None = None  # where the CPU was when the time limit expired (runners/hang.py)
    # Where a failed execute() stopped in the program and the model (locate_execute_failure).
    execute_failure: str | None = None
    # What emulated the CPU when the timing record's clock is an emulator's, not the board's
    # (a Linux runner under qemu-user): its ticks are no measurement of the board.
    emulated_by: str | None = None

    @property
    def stats(self) -> DecodeStats:
        return self.records.stats

    @property
    def instructions_per_iteration_estimate(self) -> float | None:
        t = self.records.timing
        if self.instructions_estimate is None or t is None or not t.iterations:
            return None
        return self.instructions_estimate / t.iterations

    def _where(self) -> str:
        logs = f"console log {self.console_log}"
        if self.runner_log is not None:
            logs += f", {self.runner} log {self.runner_log}"
        return logs

    def outcome(self) -> Outcome:
        """The records' classification, plus what only the runner knows (exit code, kill)."""
        rec = self.records
        who = self.runner or "the target"
        if self.timed_out:
            limit = f"the {self.timeout_s:g} s" if self.timeout_s is not None else "the"
            how = f"{who} was killed after {limit} host-side limit"
        elif self.exit_code is not None:
            how = f"{who} exited with code {self.exit_code}"
        else:
            how = None
        base = rec.outcome(timed_out=self.timed_out, how=how, located=self.execute_failure)
        if base.exit_code == ExitCode.TIMEOUT and self.hang:
            base = Outcome(base.exit_code, f"{base.cause} {self.hang}.",
                           "The firmware hangs there, or needs a longer timeout.")
        if base.exit_code in (ExitCode.FAULT, ExitCode.DEVICE_ERROR) and self.timed_out:
            base = Outcome(base.exit_code, f"{base.cause} Then {how}.", base.hint)
        if base.exit_code in (ExitCode.NO_BOOT, ExitCode.FAULT):
            return base
        if self.supports_exit_code and rec.done is not None:
            status = rec.done.status
            if self.exit_code is None:
                return Outcome(
                    ExitCode.PROTOCOL,
                    f"The firmware sent done (status {status}) but {who} did not exit; "
                    f"it was killed.",
                    "The firmware must exit through semihosting SYS_EXIT_EXTENDED after done.")
            if self.exit_code != status:
                return Outcome(
                    ExitCode.PROTOCOL,
                    f"{who} exit code {self.exit_code} disagrees with done.status {status}.",
                    "The firmware must exit with the status it reports in done.")
        return base

    def locate_execute_failure(self, pte: bytes,
                               sources: Mapping[int, str]) -> LocatedFailure | None:
        """Place a failed execute() in the program that ran and the model (the export's
        instruction sources; readers/execute_failure.py); the outcome then names it. None
        when no execute() failed."""
        from deploykit.readers.execute_failure import locate

        if not self.records.execute_errors:
            return None
        located = locate(self.records.execute_errors[-1], pte, sources)
        self.execute_failure = located.text
        return located

    def check(self) -> RunResult:
        """Return self when the run succeeded; raise RunError (exit code per class) otherwise."""
        o = self.outcome()
        if o.ok:
            return self
        hint = " ".join(x for x in (o.hint, f"See the {self._where()}.") if x)
        raise RunError(o.cause, hint, exit_code=o.exit_code, log_path=str(self.console_log))


class Runner(abc.ABC):
    """Runs one ELF and returns its decoded results. Subclasses set the capability flags."""

    kind: ClassVar[str] = ""
    supports_exit_code: ClassVar[bool] = False
    supports_icount: ClassVar[bool] = False
    is_simulator: ClassVar[bool] = False
    supports_stream: ClassVar[bool] = False
    options: ClassVar[tuple[RunnerOption, ...]] = ()

    @classmethod
    def from_board(cls, board: Any, *, progress: Any = None, workspace: Path | None = None,
                   **kwargs: Any) -> Runner:
        """The runner for `board` (configured from its `runner:` section). `progress` and
        `workspace` are offered to every runner; a simulator needs neither."""
        return cls(runner_section(board), **kwargs)  # type: ignore[call-arg]

    @classmethod
    def check_options(cls, board_name: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options of `given` that were set, after checking this runner takes them."""
        declared = {o.dest: o.flag for o in cls.options}
        set_ = {k: v for k, v in given.items() if v is not None}
        extra = [k for k in set_ if k not in declared]
        if extra:
            flags = "/".join(f"--{k.replace('_', '-')}" for k in extra)
            takes = ", ".join(declared.values()) or "no options"
            raise ConfigError(f"{flags} is not an option of the {cls.kind} runner that "
                              f"{board_name} runs on (it takes {takes}).",
                              "Leave it out for this board.")
        return set_

    @classmethod
    def capabilities(cls) -> dict[str, bool]:
        return {"supports_exit_code": cls.supports_exit_code,
                "supports_icount": cls.supports_icount,
                "is_simulator": cls.is_simulator,
                "supports_stream": cls.supports_stream}

    def check_environment(self) -> str | None:
        """Raise EnvironmentProblem when a tool the runner needs is missing; else its path."""
        return None

    def open_stream(self, elf: Path, out_dir: Path) -> StreamLink:
        """Start serve firmware `elf` and return a two-way link to it (run/stream.py), logs
        under `out_dir/run/`. Runners that can declare `supports_stream`."""
        raise ConfigError(f"The {self.kind} runner cannot stream samples to the device "
                          "(serving samples over the link is not supported by this runner).",
                          "Stream on a board whose runner supports it (qemu, pico), or run "
                          "the samples compiled in: deploykit run --inputs DIR.")

    @abc.abstractmethod
    def run(self, elf: Path, out_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
            check: bool = True) -> RunResult:
        """Run `elf`, write logs under `out_dir/run/`, return the result.

        With `check=True` (default) a failed run raises RunError with the failure class;
        with `check=False` the RunResult is returned and `result.outcome()` classifies it.
        """


def runner_section(board: Any) -> Mapping[str, Any]:
    """The `runner:` section of a board, given as a mapping or an object with `.runner`."""
    section = board.get("runner") if isinstance(board, Mapping) else getattr(board, "runner",
                                                                              None)
    name = board.get("name") if isinstance(board, Mapping) else getattr(board, "name", "?")
    if not isinstance(section, Mapping):
        raise ConfigError(f"board {name}: no `runner:` section",
                          "Add e.g. `runner: {kind: qemu, machine: mps3-an547, cpu: cortex-m55}`.")
    return section
