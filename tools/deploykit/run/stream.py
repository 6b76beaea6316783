"""Samples streamed to serve firmware over the result link, one answer each (issue #28;
docs/protocol.md "Host -> device", docs/firmware.md "Serve firmware").

`deploykit run --inputs DIR` compiles its samples into the image, so a data set is capped at what
fits in flash. Serve firmware holds no samples: the host sends each one as framed, CRC-checked
`input` frames and a `run`, the device writes the bytes straight into the method's input, runs
it and answers with the outputs and a `sample_done`; then the host sends the next.

- `StreamLink`: a runner's two-way byte connection to serve firmware it started (QEMU's console
  socket, a board's serial port after the link's handshake); runners that have one declare
  `supports_stream` and open it with `open_stream`.
- `StreamSession`: the host's side over a link. `start()` reads `hello` and `ready` (what the
  method takes and returns); `infer(inputs)` sends one sample and returns its outputs as the
  normal run's decoded outputs are (logical order, the host's dtype); `close()` sends `end` and
  returns the totals (timing, memory). Lost or damaged answers are asked for again (`run` once
  more: the device answers a second `run` of the sample it executed last without executing
  it), a sample the device did not receive whole is sent again, each a bounded number of
  times; a device that stops answering raises SampleTimeout naming the sample.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from deploykit.program.export import memory_order_bytes
from deploykit.readers.protocol import (
    SCALAR_TYPES,
    Decoder,
    DeviceError,
    Done,
    ExecuteError,
    Hello,
    Outcome,
    Ready,
    Record,
    RunRecords,
    SampleDone,
    Tensor,
)
from deploykit.readers.protocol.error_codes import BY_NAME, CODES, label
from deploykit.readers.protocol.host_frames import (
    DEFAULT_CHUNK_BYTES,
    MAX_NDIM,
    HostEncoder,
    chunks_of,
)
from deploykit.readers.protocol.outcome import execute_failure_text
from deploykit.run.report import as_host_dtype, logical_order
from deploykit.run.validate import Tolerance, Verdict, compare_outputs
from deploykit.util.errors import ConfigError, ExitCode, RunError

DEFAULT_SAMPLE_TIMEOUT_S = 30.0  # one sample: sent, executed, answered (retries included)
DEFAULT_ANSWER_WAIT_S = 1.0  # without an answer that long, `run` is sent again
DEFAULT_ATTEMPTS = 5  # sends of a sample, and of `run` for one sample
START_TIMEOUT_S = 60.0  # boot, load_method, hello and ready
INPUT_PROTOCOL = "1"

_INCOMPLETE = BY_NAME["STREAM_INCOMPLETE"].code
# Rejections that sending the same frames again can cure (the wire damaged them).
_TRANSIENT = frozenset(BY_NAME[n].code for n in (
    "STREAM_CRC", "STREAM_LENGTH", "STREAM_OFFSET", "STREAM_OVERRUN", "STREAM_INCOMPLETE",
    "STREAM_VERSION", "STREAM_TYPE"))
# Rejections of a frame whose header may have been damaged: it may have been the `run`.
_FRAMING = frozenset(BY_NAME[n].code for n in (
    "STREAM_CRC", "STREAM_LENGTH", "STREAM_VERSION", "STREAM_TYPE"))


class StreamClosed(Exception):
    """The link's other end went away (the simulator exited, the port disappeared)."""


class StreamLink(abc.ABC):
    """A two-way byte connection to serve firmware, owned by the runner that started it."""

    description: str = "the device"
    console_log: Path | None = None  # every byte received, as received

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Sends `data` (whole)."""

    @abc.abstractmethod
    def read(self, timeout_s: float) -> bytes:
        """What arrived within `timeout_s` (returns at the first bytes; b"" when none);
        StreamClosed when the other end went away and nothing is left to read."""

    @abc.abstractmethod
    def close(self, grace_s: float = 5.0) -> int | None:
        """Stops the target (after up to `grace_s` for it to end by itself) and releases the
        link; the target's exit code when it has one and exited by itself, else None."""


class StreamError(RunError):
    """A serve session that cannot go on, or a sample it could not get answered."""

    def __init__(self, cause: str, hint: str = "", *, exit_code: ExitCode = ExitCode.PROTOCOL,
                 log_path: str | None = None, sample: int | None = None) -> None:
        super().__init__(cause, hint, exit_code=exit_code, log_path=log_path)
        self.sample = sample


class SampleTimeout(StreamError):
    """The device stopped answering: no answer to a sample within the session's limit."""


class SampleFailed(StreamError):
    """The device answered a sample with a failure (an error record and a sample_done with its
    code). The session goes on: the next sample may be sent."""

    def __init__(self, cause: str, hint: str = "", *, exit_code: ExitCode, sample: int,
                 code: int, log_path: str | None = None) -> None:
        super().__init__(cause, hint, exit_code=exit_code, log_path=log_path, sample=sample)
        self.code = code


@dataclass(frozen=True)
class HostReference:
    """Samples with the host's outputs for each, as the export computed them (the model's
    example inputs, or the samples of a directory as for `run --inputs DIR`), and the
    tolerance `run` compares with: `check(k, outputs)` is run's comparison for sample k."""

    input_sets: list[list[np.ndarray]]  # logical layout, the dtype the program takes
    reference_sets: list[list[np.ndarray]]
    tolerance: Tolerance

    def check(self, k: int, outputs: Sequence[np.ndarray]) -> Verdict:
        return compare_outputs(outputs, self.reference_sets[k], self.tolerance)


@dataclass
class StreamStats:
    samples: int = 0  # answered
    frames_sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    runs_resent: int = 0  # `run` sent again: no answer in time, a damaged one, a rejected frame
    samples_resent: int = 0  # whole samples sent again: the device lacked some of one
    rejected_frames: int = 0  # error records rejecting a host frame
    infer_seconds: float = 0.0  # wall time inside infer()

    @property
    def samples_per_second(self) -> float | None:
        return self.samples / self.infer_seconds if self.infer_seconds > 0 else None


@dataclass
class StreamSummary:
    """What close() returns: every record of the session, the totals and how it ended."""

    records: RunRecords
    stats: StreamStats
    exit_code: int | None  # the target's (QEMU's), None when it has none
    outcome: Outcome
    notes: list[str] = field(default_factory=list)

    @property
    def timing(self):
        return self.records.timing

    @property
    def memory(self) -> dict[str, tuple[int, int]]:
        return dict(self.records.memory.entries) if self.records.memory else {}


class StreamSession:
    """The host's side of a serve session over `link` (module docstring). `output_quant`:
    the export's dequantize parameters per output (int8 model outputs come back dequantized,
    as the normal run compares them); None keeps the device's dtype. `reference`: samples
    with their host outputs, for the caller to compare with (api.stream gives the export's)."""

    def __init__(self, link: StreamLink, *, output_quant: Sequence[Any] | None = None,
                 reference: HostReference | None = None,
                 timeout_s: float = DEFAULT_SAMPLE_TIMEOUT_S,
                 answer_wait_s: float = DEFAULT_ANSWER_WAIT_S,
                 attempts: int = DEFAULT_ATTEMPTS, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.link = link
        self.output_quant = list(output_quant) if output_quant is not None else None
        self.reference = reference
        self.timeout_s = timeout_s
        self.answer_wait_s = answer_wait_s
        self.attempts = attempts
        self.chunk_bytes = chunk_bytes
        self.start_timeout_s = start_timeout_s
        self.stats = StreamStats()
        self._placed: ExecuteError | None = None  # the last execute_error, until reported
        self.decoder = Decoder()
        self.encoder = HostEncoder()
        self.hello: Hello | None = None
        self.ready: Ready | None = None
        self._next_sample = 0
        self._ended: Done | None = None  # the device sent done (after end, or failing)
        self._summary: StreamSummary | None = None

    # ---- plumbing ------------------------------------------------------------------------

    def _send(self, data: bytes, frames: int) -> None:
        try:
            self.link.write(data)
        except StreamClosed:
            self._closed_error()
        self.stats.frames_sent += frames
        self.stats.bytes_sent += len(data)

    def _receive(self, timeout_s: float) -> list[Record]:
        try:
            data = self.link.read(max(0.0, timeout_s))
        except StreamClosed:
            self._closed_error()
        self.stats.bytes_received += len(data)
        records = self.decoder.feed(data) if data else []
        for r in records:
            if isinstance(r, Done):
                self._ended = r
            elif isinstance(r, DeviceError):
                entry = CODES.get(r.code)
                if entry is not None and entry.sample:
                    self.stats.rejected_frames += 1
        return records

    def _run_records(self) -> RunRecords:
        return RunRecords.build(self.decoder.records, self.decoder.stats)

    def _log_hint(self) -> str:
        log = self.link.console_log
        return f"The console log: {log}." if log else ""

    def _closed_error(self):
        """The device ended the session: what its records say, as a StreamError."""
        self.decoder.finish()
        run = self._run_records()
        outcome = run.outcome(how=f"{self.link.description} closed the link")
        if outcome.ok:  # done 0 without `end` from us
            outcome = Outcome(ExitCode.PROTOCOL, f"{self.link.description} ended the session "
                              f"by itself ({run.summary()}).")
        raise StreamError(outcome.cause, " ".join(x for x in (outcome.hint, self._log_hint())
                                                  if x), exit_code=outcome.exit_code)

    # ---- the session -----------------------------------------------------------------------

    def start(self) -> Ready:
        """Reads the device's hello and ready (it boots and loads the method first)."""
        if self.ready is not None:
            return self.ready
        deadline = time.monotonic() + self.start_timeout_s
        while self.ready is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamError(
                    f"{self.link.description} sent no ready record in {self.start_timeout_s:g} s "
                    f"(received: {self._run_records().summary()}).",
                    "Serve firmware sends ready after loading the method; check that the image "
                    f"is serve firmware and boots. {self._log_hint()}".strip(),
                    exit_code=ExitCode.TIMEOUT)
            for r in self._receive(min(left, 0.5)):
                if isinstance(r, Hello):
                    self.hello = r
                    self._check_hello(r)
                elif isinstance(r, Ready):
                    self.ready = r
            if self._ended is not None:  # load failed: error, done, exit
                self._closed_error()
        return self.ready

    def _check_hello(self, hello: Hello) -> None:
        fields = hello.fields
        if fields.get("serve") != "1":
            raise StreamError(
                f"{self.link.description} runs firmware that does not serve samples "
                f"(its hello has no serve=1: firmware={fields.get('firmware')}).",
                "Build serve firmware (deploykit.api.stream builds and starts it).",
                exit_code=ExitCode.CONFIG)
        if fields.get("input_protocol") != INPUT_PROTOCOL:
            raise StreamError(
                f"{self.link.description} speaks host frames version "
                f"{fields.get('input_protocol')}; this host speaks {INPUT_PROTOCOL}.",
                "Rebuild the serve firmware with this deploykit.", exit_code=ExitCode.CONFIG)

    def _encoded(self, inputs: Sequence[Any]) -> list[tuple[int, list[int], bytes]]:
        """Each input checked against `ready` and laid out in the method's memory order."""
        specs = self.ready.inputs
        if len(inputs) != len(specs):
            raise ConfigError(f"{len(inputs)} input(s) given; the model takes {len(specs)}: "
                              + ", ".join(s.describe() for s in specs) + ".",
                              "Pass one array per model input, in order.")
        out = []
        for i, (value, spec) in enumerate(zip(inputs, specs, strict=True)):
            array = np.asarray(value)
            expected = SCALAR_TYPES.get(spec.dtype)
            if expected is None:
                raise ConfigError(f"input {i} is {spec.dtype_name}, which host frames do not "
                                  "carry.", "Export the model with inputs of a dtype "
                                  "docs/protocol.md lists.")
            if array.dtype.newbyteorder("<") != expected or array.shape != spec.sizes:
                raise ConfigError(f"input {i} is {array.dtype} {list(array.shape)}; the model "
                                  f"takes {spec.describe()}.",
                                  f"Give it as numpy.asarray(x, dtype='{expected.name}') of "
                                  f"shape {list(spec.sizes)}.")
            if len(spec.sizes) > MAX_NDIM:
                raise ConfigError(f"input {i} has rank {len(spec.sizes)}; host frames carry "
                                  f"at most {MAX_NDIM}.", "Reshape the model's input.")
            data = memory_order_bytes(array.astype(expected, copy=False), list(spec.dim_order))
            out.append((spec.dtype, list(spec.sizes), data))
        return out

    def _outputs(self, tensors: dict[int, Tensor]) -> list[np.ndarray] | None:
        """The answer's outputs as the host's arrays; None when one is missing (damaged on the
        way) or differs from `ready`."""
        out = []
        for i, spec in enumerate(self.ready.outputs):
            t = tensors.get(i)
            if t is None or t.dtype != spec.dtype or tuple(t.sizes) != spec.sizes:
                return None
            data = logical_order(t.data, list(spec.dim_order)).copy()
            quant = self.output_quant[i] if self.output_quant else None
            out.append(as_host_dtype(data, quant))
        return out

    def infer(self, inputs: Sequence[Any]) -> list[np.ndarray]:
        """Sends one sample (one array per model input, logical layout, the dtype the model
        takes), returns its outputs. SampleFailed when the device reports a failure for it
        (the session goes on), SampleTimeout when it stops answering."""
        start = time.monotonic()
        self.start()
        if self._ended is not None:
            raise StreamError("The serve session has ended (end was sent, or the device "
                              "stopped).", "Open a new session.")
        payload = self._encoded(inputs)
        k = self._next_sample
        self._next_sample += 1
        try:
            return self._exchange(k, payload)
        finally:
            self.stats.infer_seconds += time.monotonic() - start

    def _exchange(self, k: int, payload: list[tuple[int, list[int], bytes]]) -> list[np.ndarray]:
        deadline = time.monotonic() + self.timeout_s
        sample_sends = run_sends = 0
        latest = -1  # seq of the last `run` sent; answers to earlier ones are stale
        errors: list[DeviceError] = []
        tensors: dict[int, Tensor] = {}
        frames = sum(chunks_of(len(data), len(sizes), self.chunk_bytes)
                     for _, sizes, data in payload)

        def send_sample() -> None:
            nonlocal sample_sends
            sample_sends += 1
            self._send(self.encoder.inputs(k, payload, self.chunk_bytes), frames)
            send_run()

        def send_run() -> None:
            nonlocal run_sends, latest, next_retry
            latest, frame = self.encoder.run(k)
            run_sends += 1
            self._send(frame, 1)
            next_retry = time.monotonic() + self.answer_wait_s

        next_retry = 0.0
        send_sample()
        corrupted = self.decoder.stats.corrupted_frames
        while True:
            now = time.monotonic()
            if now >= deadline or run_sends > 2 * self.attempts:
                waited = self.timeout_s - (deadline - now)
                raise SampleTimeout(
                    f"sample {k}: no answer from {self.link.description} in {waited:.1f} s "
                    f"({sample_sends} send(s) of the sample, {run_sends} of its run; "
                    f"received: {self._run_records().summary()}).",
                    "The firmware hangs or runs slower than the limit: give a longer "
                    f"timeout. {self._log_hint()}".strip(),
                    exit_code=ExitCode.TIMEOUT, sample=k)
            records = self._receive(min(deadline, next_retry) - now)
            resend_run = False
            for r in records:
                if isinstance(r, Tensor):
                    tensors[r.index] = r
                elif isinstance(r, ExecuteError):
                    self._placed = r  # where this sample's execute() stopped
                elif isinstance(r, DeviceError):
                    errors.append(r)
                    resend_run |= r.code in _FRAMING  # the damaged frame may have been the run
                elif isinstance(r, SampleDone):
                    got, tensors = tensors, {}
                    if r.sample != k:
                        continue  # an answer to an earlier sample, sent again
                    if r.status == 0:
                        outputs = self._outputs(got)
                        if outputs is not None:
                            self.stats.samples += 1
                            self.stats.runs_resent += run_sends - sample_sends
                            self.stats.samples_resent += sample_sends - 1
                            return outputs
                        resend_run |= r.run_seq == latest  # its answer arrived damaged
                    elif r.run_seq == latest:
                        self._failed(k, r, errors, sample_sends)
                        send_sample()
                        resend_run = False
            if self._ended is not None:
                self._closed_error()
            if self.decoder.stats.corrupted_frames != corrupted:
                corrupted = self.decoder.stats.corrupted_frames
                resend_run = True  # part of an answer was damaged: ask for it again
            if resend_run or time.monotonic() >= next_retry:
                send_run()

    def _failed(self, k: int, done: SampleDone, errors: list[DeviceError],
                sample_sends: int) -> None:
        """A sample answered with a failure: raise, unless sending it again can cure it (the
        device lacked some of it, the wire's fault) and attempts are left."""
        if done.status == _INCOMPLETE:
            lasting = [e for e in errors if e.code not in _TRANSIENT]
            if not lasting and sample_sends < self.attempts:
                return
            if lasting:  # e.g. a shape the method does not take: sending again cannot help
                raise self._failure(k, lasting[0].code, lasting)
            shown = "; ".join(f"{label(e.code)}: {e.message}" for e in errors[-3:])
            raise StreamError(f"sample {k}: {self.link.description} did not receive it whole "
                              f"in {sample_sends} sends ({shown}).",
                              CODES[_INCOMPLETE].advice, exit_code=ExitCode.PROTOCOL, sample=k)
        raise self._failure(k, done.status, [e for e in errors if e.code == done.status])

    def _failure(self, k: int, code: int, errors: list[DeviceError]) -> SampleFailed:
        entry = CODES.get(code)
        placed, self._placed = self._placed, None
        if placed is not None:  # execute() failed: said by where it stopped (execute_error)
            errors = [e for e in errors if not (e.code == placed.code
                                                and e.message == "execute failed")]
        why = "; ".join(([execute_failure_text(placed)] if placed is not None else [])
                        + [f"{label(e.code)}: {e.message}" for e in errors[-3:]]) or label(code)
        return SampleFailed(f"sample {k} failed on {self.link.description}: {why}.",
                            entry.advice if entry else "See the device's error records.",
                            exit_code=ExitCode[entry.exit_class] if entry
                            else ExitCode.DEVICE_ERROR, sample=k, code=code)

    def close(self) -> StreamSummary:
        """Sends `end`, reads the totals and `done`, and stops the target. Raises StreamError
        when the device does not end cleanly; a second call returns the same summary."""
        if self._summary is not None:
            return self._summary
        notes: list[str] = []
        try:
            deadline = time.monotonic() + self.timeout_s
            next_end = 0.0
            while self._ended is None:
                now = time.monotonic()
                if now >= deadline:
                    notes.append(f"no done within {self.timeout_s:g} s of end")
                    break
                if now >= next_end:
                    self._send(self.encoder.end()[1], 1)
                    next_end = now + self.answer_wait_s
                self._receive(min(deadline, next_end) - now)
        except StreamError as exc:
            notes.append(exc.cause)
        exit_code = self.link.close()
        self.decoder.finish()
        run = self._run_records()
        outcome = run.outcome(how=f"{self.link.description} ended")
        if (outcome.exit_code == ExitCode.PROTOCOL and run.done is not None
                and run.done.status == 0 and not run.errors and run.fault is None):
            # Damaged or lost frames on the way were asked for again, sample by sample.
            notes.append("recovered on the way: " + "; ".join(run.stats.problems()))
            outcome = Outcome(ExitCode.OK, "done, status 0")
        if outcome.ok and exit_code not in (None, 0):
            outcome = Outcome(ExitCode.PROTOCOL, f"{self.link.description} exit code "
                              f"{exit_code} disagrees with done.status 0.")
        self._summary = StreamSummary(run, self.stats, exit_code, outcome, notes)
        if not outcome.ok:
            raise StreamError(outcome.cause, " ".join(x for x in (outcome.hint,
                                                                  self._log_hint()) if x),
                              exit_code=outcome.exit_code)
        return self._summary

    def __enter__(self) -> StreamSession:
        try:
            self.start()
        except BaseException:
            self.link.close(grace_s=0.0)
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
            return
        # The body failed: end the device's session if it still listens, without masking why.
        with contextlib.suppress(Exception):
            self.close()
