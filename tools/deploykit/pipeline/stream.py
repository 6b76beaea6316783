"""`api.stream`: serve firmware for a model, built through the usual build path and started on
the board's runner, with a serve session over its link (run/stream.py; issue #28).

Serve firmware is the runner built with DK_SERVE (firmware/runner/runner.cpp): the same export,
memory plan and pools as the plain firmware, built into `<out>/firmware-serve` as the profiling
firmware is built into its own directory; the samples come over the link instead of from flash
(docs/firmware.md, "Serve firmware"). The session's logs are under `<out>/stream/run/`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deploykit.pipeline.chains import BuiltModel, FirmwareVariant, build_firmware, export_stage
from deploykit.pipeline.target import Target
from deploykit.program.imported import NO_REFERENCE
from deploykit.readers.pte_reader import read_pte_info
from deploykit.run.stream import DEFAULT_SAMPLE_TIMEOUT_S, HostReference, StreamSession
from deploykit.run.validate import Tolerance
from deploykit.util.errors import ConfigError

SERVE_DIR = "firmware-serve"
STREAM_DIR = "stream"

Progress = Callable[[str], None]


def serve_definitions(pte: Path) -> dict[str, str]:
    """The CMake definitions of serve firmware for the program `pte`: DK_SERVE, and the bytes of
    the buffer its unplanned inputs are received in (the normal firmware reads those in place
    from flash; planned ones are received into the planned buffer), each on 16 bytes."""
    info = read_pte_info(pte)
    unplanned = sum((t.nbytes + 15) // 16 * 16 for t in info.inputs if not t.planned)
    return {"DK_SERVE": "ON", "DK_SERVE_INPUT_BYTES": str(unplanned)}


def build_serve_firmware(target: Target, model: str, out: Path, workspace: Path | None,
                         progress: Progress, *, inputs_dir: Path | None = None,
                         fit: bool = False, timeout: float = 120.0,
                         calibration: str | None = None) -> BuiltModel:
    """Serve firmware for `model`. With `fit`, the plain firmware is measured first (serve
    firmware takes no samples of its own to measure with) and serve firmware is linked with
    the same pools and stack. `inputs_dir`: samples whose host outputs the export computes
    (as for run --inputs); serve firmware embeds none of them. `calibration`: what the int8
    program calibrates on (export_stage's; `deploykit validate --calibration`)."""
    if fit:
        build_firmware(target, model, out, workspace, progress, inputs_dir=inputs_dir, fit=True,
                       timeout=timeout, calibration=calibration)
    exported = export_stage(target, model, out, progress, inputs_dir=inputs_dir,
                            calibration=calibration)
    progress("building the serve firmware (samples come over the link; the runtime is the "
             "plain firmware's)")
    return build_firmware(target, model, out, workspace, progress, inputs_dir=inputs_dir,
                          timeout=timeout, calibration=calibration,
                          variant=FirmwareVariant(SERVE_DIR,
                                                  serve_definitions(exported.pte_path)))


def open_stream(target: Target, model: str, out: Path, workspace: Path | None,
                progress: Progress, *, inputs_dir: Path | None = None, fit: bool = False,
                timeout: float = 120.0, sample_timeout: float = DEFAULT_SAMPLE_TIMEOUT_S,
                tolerance: Tolerance | None = None,
                calibration: str | None = None) -> StreamSession:
    """Build serve firmware, start it on the board's runner and return the started session
    (hello and ready read), with the export's samples and host outputs as its `reference`
    (none for a program that cannot run on the host). `timeout` bounds the build's
    measurement run and the start; `sample_timeout` each sample; `tolerance` overrides the
    model's; `calibration`: build_serve_firmware's."""
    if not target.runner.supports_stream:
        raise ConfigError(f"{target.name} runs on the {target.runner.kind} runner, which cannot "
                          "stream samples to the device.",
                          "Stream on a QEMU board or a Pico 2, or run the samples compiled in: "
                          "deploykit run --inputs DIR.")
    built = build_serve_firmware(target, model, out, workspace, progress,
                                 inputs_dir=inputs_dir, fit=fit, timeout=timeout,
                                 calibration=calibration)
    exported = built.planned.export
    reference = None if exported.reference_kind == NO_REFERENCE else HostReference(
        exported.input_sets, exported.reference_sets,
        tolerance or Tolerance(**exported.tolerance))
    runner = target.make_runner(workspace, progress)
    progress(f"starting the serve firmware on {runner.kind}")
    link = runner.open_stream(built.firmware.elf, out / STREAM_DIR)
    session = StreamSession(link, output_quant=exported.output_quant, reference=reference,
                            timeout_s=sample_timeout, start_timeout_s=timeout)
    try:
        session.start()
    except BaseException:
        link.close(grace_s=0.0)
        raise
    return session
