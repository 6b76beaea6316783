"""How a run ended, judged from its records alone, as a CLI exit code (deploykit.util.errors).

Runners add their own checks on top (an exit code that disagrees, a process that had to be
killed); `Outcome.to_error()` turns a failed outcome into the RunError the CLI reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from deploykit.readers.protocol.error_codes import CODES, label
from deploykit.readers.protocol.records import SEQ_MODULO, DoneStatus, ExecuteError
from deploykit.util.errors import ExitCode, RunError

if TYPE_CHECKING:  # a type only: the decoder imports this module to classify its RunRecords
    from deploykit.readers.protocol.decoder import RunRecords


@dataclass(frozen=True)
class Outcome:
    """The verdict on one run: the exit code the CLI returns, the cause, and what to try."""

    exit_code: ExitCode
    cause: str
    hint: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK

    def to_error(self, log_path: str | None = None) -> RunError:
        return RunError(self.cause, self.hint, exit_code=self.exit_code, log_path=log_path)


def classify(run: RunRecords, *, timed_out: bool = False, how: str | None = None,
             located: str | None = None) -> Outcome:
    """Classify the run from the records alone (runners add exit-code checks on top).

    Order: nothing valid -> NO_BOOT (PROTOCOL if frames were seen but none was valid);
    fault -> FAULT; error record or done.status != 0 -> DEVICE_ERROR; no done ->
    TIMEOUT (the host gave up) or PROTOCOL (the stream ended); any decode problem ->
    PROTOCOL. `how` says how the run ended, e.g. "QEMU exited with code 1". `located`: where
    a failed execute() stopped in the program and the model (readers/execute_failure.py), which
    only a caller with the program knows; without it the execute_error record says what it can.
    """
    s = run.stats
    how = how or ("the host timed out" if timed_out else "the output ended")
    if not run.records:
        if s.frames_accepted or s.corrupted_frames:
            why = (f"{s.corrupted_frames} corrupted frame(s)" if s.corrupted_frames
                   else "; ".join(s.problems()))
            return Outcome(ExitCode.PROTOCOL, f"No valid record decoded ({why}; {how}).",
                           "Line noise, a wrong baud rate or a protocol version mismatch.")
        tail = s.noise_tail[-200:].decode("utf-8", errors="replace").strip()
        console = (f" The console printed {s.noise_bytes} byte(s), ending: {tail!r}."
                   if s.noise_bytes else " The console printed nothing.")
        return Outcome(ExitCode.NO_BOOT, f"No record from the device ({how}).{console}",
                       "Check that the firmware boots and that its console is the "
                       "board's UART.")
    if run.fault is not None:
        return Outcome(ExitCode.FAULT, f"The device faulted: {run.fault.describe()}.",
                       "Look up pc in the ELF: arm-none-eabi-addr2line -e <elf> <pc>.")
    if run.errors or (run.done is not None and run.done.status != 0):
        return _device_error(run, located)
    if run.done is None:
        if timed_out:
            return Outcome(ExitCode.TIMEOUT,
                           f"Timed out without a done record ({how}). "
                           f"Received so far: {run.summary()}.",
                           "The firmware hangs, or needs a longer timeout.")
        return Outcome(ExitCode.PROTOCOL,
                       f"The output ended without a done record ({how}). "
                       f"Received: {run.summary()}.",
                       "The firmware stopped or reset before finishing.")
    problems = s.problems()
    if problems:
        return Outcome(ExitCode.PROTOCOL,
                       "The result stream is not trustworthy: " + "; ".join(problems) + ".",
                       "Details: " + "; ".join(s.notes[:3]) + "." if s.notes else "")
    return Outcome(ExitCode.OK, "done, status 0")


def execute_failure_text(failure: ExecuteError) -> str:
    """What an execute_error record says without the program: the step and the kernel's
    message, else the Error ("execute failed at step 3: arm_convolve_wrapper_s8 returned
    ARM_CMSIS_NN_ARG_ERROR")."""
    why = failure.kernel_message or label(failure.code)
    if failure.step is None:
        return f"execute failed before its first instruction: {why}"
    return f"execute failed at step {failure.step}: {why}"


def _device_error(run: RunRecords, located: str | None = None) -> Outcome:
    """An error record or a failed `done`: the codes named ("MemoryAllocationFailed (0x21)"),
    the failure class and the advice of the first code the table knows (protocol/errors.yaml);
    DEVICE_ERROR when it knows none. A failed execute() is named by where it stopped (its
    execute_error record) in place of the bare "execute failed" error it comes with."""
    parts = [f"{label(e.code)}: {e.message}" for e in run.errors[:3]]
    # The execute_error record right before one of the run's errors (serve firmware's earlier
    # ones belong to samples it answered, docs/protocol.md).
    following = {(e.seq - 1) % SEQ_MODULO for e in run.errors}
    failure = next((f for f in reversed(run.execute_errors) if f.seq in following), None)
    if failure is not None:
        parts = [located or execute_failure_text(failure)] + [
            f"{label(e.code)}: {e.message}" for e in run.errors[:3]
            if not (e.code == failure.code and e.message == "execute failed")]
    msgs = "; ".join(parts)
    status = f"done status {run.done.status}" if run.done else "no done"
    known = [CODES[e.code] for e in run.errors if e.code in CODES]
    exit_code, hint = ExitCode.DEVICE_ERROR, "See the device's error records."
    if known:
        exit_code, hint = ExitCode[known[0].exit_class], known[0].advice or hint
    elif run.done is not None and run.done.status == DoneStatus.POOL_TOO_SMALL:
        hint = "A memory pool is too small; enlarge it in the memory plan."
    elif run.done is not None and run.done.status == DoneStatus.FAULT:
        hint = "done reports a fault but no fault record arrived."
    return Outcome(exit_code, f"The device reported an error ({status}"
                   + (f"; {msgs}" if msgs else "") + ").", hint)


def pool_too_small(run: RunRecords) -> str | None:
    """The pool the device reported too small (its error code names it), or None."""
    for e in run.errors:
        entry = CODES.get(e.code)
        if entry is not None and entry.pool is not None:
            return entry.pool
    return None
