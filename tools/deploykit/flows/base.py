"""The Flow type: what every export flow declares and does, with typed inputs and results."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from deploykit.flows.common import parse_cpu

if TYPE_CHECKING:
    from deploykit.flows.common import Stages
    from deploykit.memory.plan import MemoryPlan
    from deploykit.program.models import ModelSpec
    from deploykit.readers.boards import Board
    from deploykit.readers.pte_reader import PteInfo
    from deploykit.readers.sources import Workspace

# Used when the model file gives no TOLERANCE for the flow (device vs reference).
DEFAULT_FP32_TOLERANCE = {"atol": 1e-5, "rtol": 0.0}
DEFAULT_INT8_STEPS = 2.0  # int8 default atol: this many output quantization steps
# ExportOptions.calibration: the samples an int8 flow calibrates on.
CALIBRATIONS = {"model": "the model's calibration_inputs()",
                "example": "the model's example_inputs() alone"}


@dataclass(frozen=True)
class ExportOptions:
    """Export choices of a build profile (deploykit.pipeline.profiles)."""

    # portable_fp32: constant_prop_pass folds constant subgraphs (the weight transposes of
    # every Linear), so they are not recomputed on every inference.
    fold_constants: bool = True
    # cortex_m_int8: the program takes int8 inputs / returns int8 outputs where the graph
    # starts with a quantize / ends with a dequantize (the device skips the float conversion;
    # the host quantizes the inputs and the reference outputs with the same parameters).
    int8_io: bool = False
    # Memory-plan the graph inputs (ExecuTorch's default): Method::set_input copies each input
    # into the planned buffers. False: inputs are not planned, set_input hands the method the
    # caller's buffer (the runner's embedded inputs, read in place), and the planned buffers
    # shrink by the input bytes.
    plan_inputs: bool = True
    # cortex_m_int8: an operator the int8 lowering cannot take is an error, instead of being
    # kept in float (automatic mixed precision, flows/mixed_precision.py).
    strict: bool = False
    # What an int8 flow calibrates on (CALIBRATIONS): "model", the model file's
    # calibration_inputs() (its example inputs when it has none); "example", its example
    # inputs alone (`deploykit validate` shows the accuracy of both, docs/validation.md).
    calibration: str = "model"
    # Patch-based execution of the first stage (flows/patches.py): "off", "auto" or a grid
    # "NxM" of tiles.
    patches: str = "off"

    def key(self) -> str:
        return (f"fold_constants={self.fold_constants} int8_io={self.int8_io} "
                f"plan_inputs={self.plan_inputs}" + (" strict=True" if self.strict else "")
                + (f" calibration={self.calibration}" if self.calibration != "model" else "")
                + (f" patches={self.patches}" if self.patches != "off" else ""))

    def backend_config(self, copies_in_memory_order: bool = False, in_place: Any = None,
                       **kwargs: Any) -> Any:
        """to_executorch's ExecutorchBackendConfig for these options (and `kwargs`).
        `copies_in_memory_order`: the program runs on deploykit's copy kernels, so slices and
        joins keep their input's dim order; `in_place` (a memory_planning.InPlacePlanning):
        on deploykit's checked CMSIS-NN calls, layers write over inputs that die there
        (flows/memory_planning.py, flows/in_place.py)."""
        from executorch.exir import ExecutorchBackendConfig

        from deploykit.flows.memory_planning import memory_planning_pass

        return ExecutorchBackendConfig(
            memory_planning_pass=memory_planning_pass(
                alloc_graph_input=self.plan_inputs,
                copies_in_memory_order=copies_in_memory_order, in_place=in_place),
            **kwargs)


@dataclass(frozen=True)
class QuantParams:
    """Affine int quantization of one tensor: real = (q - zero_point) * scale."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int
    dtype: str  # "int8"

    def to_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "zero_point": self.zero_point, "qmin": self.qmin,
                "qmax": self.qmax, "dtype": self.dtype}


@dataclass(frozen=True)
class ExportTarget:
    """What the export is specialised to: the board's CPU and, for NPU flows, the NPU."""

    cpu: str  # GCC-style, e.g. cortex-m55, cortex-m33+nodsp
    # Flow-specific target settings from `Flow.target_settings` (the Ethos-U flow: Vela
    # target, system config, memory mode); None for CPU-only flows.
    settings: dict[str, Any] | None = None


@dataclass
class FlowResult:
    """What a flow's lowering hands the export stage (tensors are torch tensors)."""

    pte: bytes
    inputs: tuple[Any, ...]  # the example inputs as the program takes them
    reference: list[Any]  # the host reference the device must match
    eager: list[Any]  # float PyTorch eager on the same inputs
    input_quant: list[QuantParams | None]
    output_quant: list[QuantParams | None]
    reference_kind: str
    # The reference of another input set, given as the program takes it; None when the flow
    # cannot compute one (`deploykit run --inputs` is then refused).
    reference_fn: Callable[[tuple[Any, ...]], list[Any]] | None
    # A set of float inputs as the program takes them (layout, int8 I/O).
    prepare_inputs: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None
    pt2e_reference: list[Any] | None = None  # the quantized PT2E model's outputs (int8 flows)
    report: dict[str, Any] = field(default_factory=dict)  # flow entries of export.json
    reference_report: dict[str, Any] = field(default_factory=dict)  # under "reference"
    warnings: list[str] = field(default_factory=list)
    # Further files of the export, by name, written beside the .pte (the Ethos-U flow: each
    # delegate's TOSA flatbuffer, for `deploykit explore --tosa`). Names match FLOW_FILE_GLOBS.
    files: dict[str, bytes] = field(default_factory=dict)
    # ExecuTorch's ETRecord of this export (executorch.devtools), written beside the .pte as
    # model.etrecord, so that Inspector can read a profile's ETDump with it; None when the flow
    # makes none.
    etrecord: Any = None
    # The final program's graph (out-variant operators, with the model's stack traces): the
    # operator-coverage check names the model line of an operator with no kernel from it.
    program_graph: Any = None


# The names a flow may give its further files (FlowResult.files), so that an export removes
# a previous export's files of that kind before it writes its own.
DELEGATE_TOSA_NAME = "delegate_{index}.tosa"
# The export directory's log of what a flow worked around (the cortex_m flow's mixed
# precision: the upstream failure and its reproduction).
NOTES_NAME = "export-notes.log"
FLOW_FILE_GLOBS = ("delegate_*.tosa", NOTES_NAME)


class Flow(abc.ABC):
    """One export flow. Subclasses set the class attributes and implement `lower`."""

    name: ClassVar[str]
    summary: ClassVar[str]  # one line for --help and docs
    quantization: ClassVar[str]  # how it quantizes ("none (fp32)", "int8 PT2E, ...")
    lowering: ClassVar[str]  # how it lowers
    host_reference: ClassVar[str]  # what the device's outputs are compared with
    needs_npu: ClassVar[bool] = False
    quantized: ClassVar[bool] = False  # outputs carry quantization steps (tolerance default)
    # The reference kind when the flow's preferred reference could not run.
    fallback_reference_kind: ClassVar[str]
    # Why `--patches` (flows/patches.py) cannot apply to this flow's programs; "" when it can.
    patches_refusal: ClassVar[str] = ("it does not tile its programs' first layers (patches "
                                      "run in the cortex_m_int8 and portable_fp32 flows)")

    def applies_to(self, board: Board) -> str | None:
        """None when the flow can target `board`, else why not (shown to the user)."""
        return None

    def target_settings(self, board: Board) -> dict[str, Any] | None:
        """Flow-specific target settings from the board (part of the export's cache key)."""
        return None

    def target_description(self, target: ExportTarget) -> str:
        return target.cpu

    def validate(self, target: ExportTarget) -> None:
        """Check the target before any heavy work; raise ConfigError."""
        parse_cpu(target.cpu)

    @abc.abstractmethod
    def lower(self, spec: ModelSpec, stages: Stages, target: ExportTarget,
              options: ExportOptions) -> FlowResult:
        """Quantize (if it does) and lower `spec` to a `.pte`, and compute the reference."""

    def check_program(self, model: str, op_list: list[str], info: PteInfo,
                      options: ExportOptions) -> list[str]:
        """Check the exported program's operators; warnings for the report, or raise
        ExportError when the program cannot be what this flow promises."""
        return []

    def program_report(self, op_list: list[str]) -> dict[str, Any]:
        """Entries of export.json that depend on the final operator list."""
        return {}

    def default_tolerance(self, output_quant: list[QuantParams | None]) -> dict[str, float]:
        if not self.quantized:
            return dict(DEFAULT_FP32_TOLERANCE)
        scales = [q.scale for q in output_quant if q is not None]
        atol = DEFAULT_INT8_STEPS * max(scales) if scales else 1e-2
        return {"atol": atol, "rtol": 0.0}

    def firmware_definitions(self, board: Board, workspace: Workspace, out: Path,
                             plan: MemoryPlan) -> dict[str, str]:
        """CMake definitions the runner firmware needs for this flow's programs (a backend to
        link, its sources); raise EnvironmentProblem when the workspace lacks them."""
        return {}

    def describe(self) -> str:
        return (f"{self.name}: {self.summary}\n  quantization: {self.quantization}\n"
                f"  lowering: {self.lowering}\n  host reference: {self.host_reference}"
                + ("\n  needs an NPU (the board's npu: section)" if self.needs_npu else ""))
