"""Inspect stage: read a `.pte` and describe what the runtime will need to run it.

Besides the operator table and buffer sizes, it lists the program's *segments* in execution
order (the instructions of the method's chain): delegate calls, and the runs of CPU kernel
calls between them. For an Ethos-U delegate it reads the Vela stream in the blob (blocks of a
16-byte name, a 16-byte header whose first int32 is the data length, and the data padded to
16 bytes; see ExecuTorch's backends/arm/scripts/get_ethosu_scratch_from_pte.py): the scratch
size the NPU needs, the command stream and weight sizes, the I/O tensors, and the Vela target,
system config and memory mode from the delegate's compile specs. The ops *inside* a delegate
are not recoverable from a Vela command stream; they come from the export-time partition
report (`export.json` `partition`, keyed by delegate index) when that report sits beside the
`.pte` and names the same SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploykit.program.costs import Island, ProgramCosts, program_costs
from deploykit.program.method_memory import MethodLoad, model_method_load
from deploykit.readers.npu import ETHOS_U_BACKEND
from deploykit.readers.pte_reader import (
    io_tensor,
    load_program,
    method_plan,
    operator_names,
    planned_buffers,
    scalar_type_name,
)
from deploykit.util.errors import ConfigError

# CPU ops that only convert between the float model I/O and the int8 the NPU works in.
QDQ_OPS = ("cortex_m::quantize_per_tensor", "cortex_m::dequantize_per_tensor",
           "quantized_decomposed::quantize_per_tensor",
           "quantized_decomposed::dequantize_per_tensor")


@dataclass(frozen=True)
class TensorInfo:
    dtype: int  # ExecuTorch ScalarType code
    sizes: tuple[int, ...]

    @property
    def dtype_name(self) -> str:
        """The dtype as users know it: "float32", "int8" (not the code 6, 1)."""
        return scalar_type_name(self.dtype)


@dataclass(frozen=True)
class VelaIo:
    shape: tuple[int, ...]  # Vela's 6-D shape
    elem_size: int
    offset: int  # in the scratch region
    region: int


@dataclass(frozen=True)
class VelaStream:
    """The blocks of an Ethos-U delegate blob (ExecuTorch's arm_vela.py writes them)."""

    blocks: dict[str, int]  # block name -> data length, in stream order
    scratch_size: int | None  # bytes of scratch (tensor arena) the command stream needs
    cmd_bytes: int
    weight_bytes: int
    inputs: tuple[VelaIo, ...]
    outputs: tuple[VelaIo, ...]


@dataclass(frozen=True)
class NpuLayer:
    """Vela's estimate of one NPU operator of a delegate (its per-layer report)."""

    op: str  # as Vela reports it: Conv2D, DepthwiseConv2D, AvgPool, ...
    name: str  # Vela's name of it: the TOSA node it computes
    model_origin: str | None  # the module and model line it comes from, where the export knows
    cycles: int  # the operator's estimate: the longest of the array's and each memory's cycles
    npu_cycles: int
    sram_cycles: int
    dram_cycles: int
    macs: int
    mac_utilisation: float
    bound: str  # "compute", or the memory whose traffic takes longest ("SRAM", "DRAM", ...)

    @classmethod
    def from_report(cls, row: dict[str, Any]) -> NpuLayer:
        return cls(op=str(row.get("op", "")), name=str(row.get("name", "")),
                   model_origin=row.get("model_line"), cycles=int(row.get("cycles", 0)),
                   npu_cycles=int(row.get("npu_cycles", 0)),
                   sram_cycles=int(row.get("sram_cycles", 0)),
                   dram_cycles=int(row.get("dram_cycles", 0)), macs=int(row.get("macs", 0)),
                   mac_utilisation=float(row.get("mac_utilisation", 0.0)),
                   bound=str(row.get("bound", "")))

    def describe(self, total_cycles: int, clock_mhz: float) -> str:
        share = self.cycles / total_cycles if total_cycles else 0.0
        time = f", {self.cycles / clock_mhz:,.1f} us" if clock_mhz else ""
        where = f" <- {self.model_origin}" if self.model_origin else ""
        return (f"{self.op} {self.name}: {_count(self.cycles)} cycles ({share:.0%}{time}), "
                f"{_count(self.macs)} MACs, {self.mac_utilisation:.0%} util, "
                f"{self.bound}-bound{where}")


@dataclass(frozen=True)
class NpuEstimate:
    """Vela's estimate of one Ethos-U delegate, made when it compiled it (export.json's
    partition report): a performance model, not a measurement."""

    total_cycles: int
    npu_cycles: int
    macs: int
    npu_macs_per_cycle: int  # the NPU's MAC configuration (e.g. 256 for ethos-u85-256)
    sram_mb: float  # traffic per inference
    dram_mb: float
    clock_mhz: float
    flash_mb: float = 0.0  # on- and off-chip flash, for systems with flash behind AXI1
    # Vela's per-operator report, in command-stream order (empty for an export made before
    # deploykit asked for it).
    layers: tuple[NpuLayer, ...] = ()

    @property
    def mac_utilisation(self) -> float:
        """MACs done / MACs the array could do in the estimated cycles."""
        peak = self.total_cycles * self.npu_macs_per_cycle
        return self.macs / peak if peak else 0.0

    def top_layers(self, n: int) -> list[NpuLayer]:
        """The `n` operators with the most cycles, most first."""
        return sorted(self.layers, key=lambda layer: -layer.cycles)[:n]

    @property
    def layer_cycles(self) -> int:
        return sum(layer.cycles for layer in self.layers)

    @classmethod
    def from_vela(cls, vela: dict[str, Any], target: str | None,
                  layers: list[dict[str, Any]] | None = None) -> NpuEstimate | None:
        """From the export report's Vela summary and per-layer report; None when it holds no
        cycle estimate (an export made before deploykit asked Vela for one)."""
        def number(key: str) -> float:
            value = vela.get(key)
            return float(value) if isinstance(value, (int, float)) else 0.0

        if not isinstance(vela.get("total_cycles"), int):
            return None
        macs_per_cycle = target.rsplit("-", 1)[-1] if target else ""
        return cls(total_cycles=vela["total_cycles"], npu_cycles=int(number("npu_cycles")),
                   macs=int(number("network_macs")),
                   npu_macs_per_cycle=int(macs_per_cycle) if macs_per_cycle.isdigit() else 0,
                   sram_mb=number("sram_mb"), dram_mb=number("dram_mb"),
                   clock_mhz=number("clock_mhz"),
                   flash_mb=number("off_chip_flash_mb") + number("on_chip_flash_mb"),
                   layers=tuple(NpuLayer.from_report(r) for r in layers or ()))

    def describe(self) -> str:
        time = (f", {self.total_cycles / self.clock_mhz:,.1f} us at {self.clock_mhz:g} MHz"
                if self.clock_mhz else "")
        return (f"NPU (Vela estimate): {_count(self.total_cycles)} cycles "
                f"({_count(self.npu_cycles)} compute), {_count(self.macs)} MACs, "
                f"{self.mac_utilisation:.0%} MAC utilisation, SRAM {self.sram_mb:.2f} MB, "
                f"DRAM {self.dram_mb:.2f} MB"
                + (f", flash {self.flash_mb:.2f} MB" if self.flash_mb else "")
                + f" per inference{time}")


def _count(n: int) -> str:
    return f"{n / 1e6:.3g} M" if n >= 1e6 else f"{n / 1e3:.3g} k" if n >= 1e3 else str(n)


@dataclass(frozen=True)
class DelegateInfo:
    backend: str
    size: int
    index: int = 0
    compile_specs: dict[str, str] = field(default_factory=dict)
    target: str | None = None  # Vela --accelerator-config, e.g. ethos-u85-256
    system_config: str | None = None
    memory_mode: str | None = None
    vela: VelaStream | None = None
    ops: dict[str, int] | None = None  # ops inside (from the export report), None if unknown
    vela_estimate: NpuEstimate | None = None  # Vela's (from the export report), None if unknown

    @property
    def scratch_size(self) -> int | None:
        return self.vela.scratch_size if self.vela else None


@dataclass(frozen=True)
class Segment:
    """One step of the method in execution order: a delegate call or a run of CPU kernels."""

    kind: str  # "delegate" | "cpu"
    ops: tuple[str, ...]  # cpu: kernels in call order; delegate: ops inside (may be empty)
    delegate: int | None = None  # index into ProgramInfo.delegates
    backend: str | None = None


@dataclass(frozen=True)
class ProgramInfo:
    """What a `.pte` asks of the runtime (method `forward`)."""

    path: Path
    size: int
    method: str
    operators: tuple[str, ...]  # "aten::add.out", in the program's operator table order
    delegates: tuple[DelegateInfo, ...]
    planned_buffers: tuple[int, ...]  # per memory id >= 1
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    num_values: int
    num_instructions: int
    constant_bytes: int
    notes: list[str] = field(default_factory=list)
    segments: tuple[Segment, ...] = ()  # execution order
    delegate_bytes: int = 0  # delegate blobs stored in the program (inline)
    partition_source: str | None = None  # where the ops inside delegates come from
    sha256: str = ""
    # What Method::load takes from the method and temp pools, modelled (program/method_memory.py).
    method_load: MethodLoad | None = None
    costs: ProgramCosts | None = None  # MACs, activation lower bound, fallbacks, islands

    @property
    def planned_total(self) -> int:
        return sum(self.planned_buffers)

    @property
    def cpu_ops(self) -> tuple[str, ...]:
        """Kernels called on the CPU, each once, in first-call order."""
        seen: dict[str, None] = {}
        for seg in self.segments:
            if seg.kind == "cpu":
                for op in seg.ops:
                    seen.setdefault(op, None)
        return tuple(seen)

    @property
    def cpu_fallback_ops(self) -> tuple[str, ...]:
        """CPU kernels outside the flow's target kernels (program/costs.py): not the
        cortex_m:: (CMSIS-NN) kernels, not the quantize/dequantize at the boundaries."""
        if self.costs is not None:
            return self.costs.fallback_ops
        return tuple(o for o in self.cpu_ops if o.split(".")[0] not in QDQ_OPS
                     and not o.startswith("cortex_m::"))

    @property
    def islands(self) -> tuple[Island, ...]:
        return self.costs.islands if self.costs is not None else ()

    @property
    def macs(self) -> int | None:
        """Convolution and linear MACs per inference: counted over the CPU kernels, plus
        Vela's count for each Ethos-U delegate; None when a delegate's count is unknown."""
        if self.costs is None:
            return None
        npu = [d.vela_estimate.macs if d.vela_estimate else None for d in self.delegates]
        if None in npu:
            return None
        return self.costs.macs + sum(n for n in npu if n is not None)

    @property
    def max_scratch(self) -> int:
        """The largest Vela scratch of any delegate (they run one at a time)."""
        return max((d.scratch_size or 0 for d in self.delegates), default=0)


def inspect_pte(path: Path, method: str = "forward", report: Path | None = None) -> ProgramInfo:
    """Describe `path`. The ops inside delegates come from `report` (default: export.json
    beside the .pte) when it was written for this very .pte."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"No .pte file at {path}.", "Run `deploykit export` first.")
    data = path.read_bytes()
    program = load_program(data, str(path))
    plan = method_plan(program, method, str(path))

    def tensor_of(index: int) -> TensorInfo:
        t = io_tensor(plan, index, str(path))
        return TensorInfo(t.scalar_type, tuple(t.sizes))

    operators = operator_names(plan)
    sha = hashlib.sha256(data).hexdigest()
    partition, source = _partition_report(report or path.parent / "export.json", sha)
    delegates = tuple(_delegate_info(program, i, d, partition)
                      for i, d in enumerate(plan.delegates))
    constant_bytes = sum(len(b.storage) for b in program.constant_buffer)
    constant_bytes += sum(s.size for s in program.segments)
    delegate_bytes = sum(len(d.data) for d in program.backend_delegate_data)
    return ProgramInfo(
        path=path,
        size=len(data),
        method=method,
        operators=operators,
        delegates=delegates,
        planned_buffers=planned_buffers(plan),
        inputs=tuple(tensor_of(i) for i in plan.inputs),
        outputs=tuple(tensor_of(i) for i in plan.outputs),
        num_values=len(plan.values),
        num_instructions=sum(len(c.instructions) for c in plan.chains),
        constant_bytes=constant_bytes,
        segments=_segments(plan, operators, delegates),
        delegate_bytes=delegate_bytes,
        partition_source=source if delegates else None,
        sha256=sha,
        method_load=model_method_load(plan),
        costs=program_costs(plan, operators),
    )


def _segments(plan: Any, operators: tuple[str, ...],
              delegates: tuple[DelegateInfo, ...]) -> tuple[Segment, ...]:
    """The chain's instructions grouped: each DelegateCall is a segment, and consecutive
    KernelCalls form one CPU segment. Moves, jumps and frees are not steps of their own."""
    out: list[Segment] = []
    run: list[str] = []
    for chain in plan.chains:
        for instr in chain.instructions:
            kind = type(instr.instr_args).__name__
            if kind == "KernelCall":
                run.append(operators[instr.instr_args.op_index])
            elif kind == "DelegateCall":
                if run:
                    out.append(Segment("cpu", tuple(run)))
                    run = []
                d = delegates[instr.instr_args.delegate_index]
                out.append(Segment("delegate", tuple(d.ops or ()), d.index, d.backend))
    if run:
        out.append(Segment("cpu", tuple(run)))
    return tuple(out)


def _partition_report(path: Path, sha: str) -> tuple[dict[int, dict[str, Any]], str | None]:
    """Each delegate's entry (ops inside, Vela's summary), by delegate index, from an export
    report for this .pte."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}, None
    if report.get("pte", {}).get("sha256") != sha or "partition" not in report:
        return {}, None
    return ({int(d["index"]): d for d in report["partition"].get("delegates", [])},
            f"{path} (export-time partition report)")


def _delegate_info(program: Any, index: int, delegate: Any,
                   partition: dict[int, dict[str, Any]]) -> DelegateInfo:
    specs = {}
    for spec in delegate.compile_specs:
        try:
            specs[spec.key] = bytes(spec.value).decode()
        except UnicodeDecodeError:
            specs[spec.key] = bytes(spec.value).hex()
    flags = dict(f.split("=", 1) for f in specs.get("compile_flags", "").split() if "=" in f)
    loc = delegate.processed
    blob = bytes(program.backend_delegate_data[loc.index].data) if loc.location == 0 else None
    vela = parse_vela_stream(blob) if blob is not None and delegate.id == ETHOS_U_BACKEND \
        else None
    entry = partition.get(index)
    target = specs.get("target") or flags.get("--accelerator-config")
    return DelegateInfo(
        backend=delegate.id, size=_delegate_size(program, delegate), index=index,
        compile_specs={k: v for k, v in specs.items() if k != "debug_artifact_path"},
        target=target,
        system_config=flags.get("--system-config"), memory_mode=flags.get("--memory-mode"),
        vela=vela, ops=dict(entry["ops"]) if entry else None,
        vela_estimate=NpuEstimate.from_vela(entry.get("vela", {}), target,
                                            entry.get("vela_layers")) if entry else None)


def iter_vela_blocks(blob: bytes):
    """(name, data) of each block of a Vela stream, up to `vela_end_stream`."""
    off = 0
    while off + 32 <= len(blob):
        name = blob[off:off + 16].split(b"\x00", 1)[0].decode("ascii", "replace")
        (size,) = struct.unpack_from("<i", blob, off + 16)
        off += 32
        if size < 0 or off + size > len(blob):
            raise ValueError(f"Vela block '{name}' claims {size} bytes past the blob's end")
        yield name, blob[off:off + size]
        off += (size + 15) // 16 * 16
        if name == "vela_end_stream":
            return


def parse_vela_stream(blob: bytes) -> VelaStream | None:
    """The Vela blocks of an Ethos-U delegate blob, or None if it is not a Vela stream."""
    try:
        blocks = list(iter_vela_blocks(blob))
    except ValueError:
        return None
    if not blocks or blocks[0][0] != "vela_bin_stream":
        return None
    named = dict(blocks)
    scratch = named.get("scratch_size")
    return VelaStream(
        blocks={name: len(data) for name, data in blocks},
        scratch_size=struct.unpack("<I", scratch[:4])[0] if scratch and len(scratch) >= 4
        else None,
        cmd_bytes=len(named.get("cmd_data", b"")),
        weight_bytes=len(named.get("weight_data", b"")),
        inputs=_vela_io(named.get("inputs", b"")),
        outputs=_vela_io(named.get("outputs", b"")))


def _vela_io(data: bytes) -> tuple[VelaIo, ...]:
    # int32 count, then per tensor: 6-D shape, element size, offset, region (9 x int32).
    if len(data) < 4:
        return ()
    (count,) = struct.unpack_from("<i", data, 0)
    out = []
    for i in range(max(count, 0)):
        if 4 + 36 * (i + 1) > len(data):
            break
        *shape, elem, offset, region = struct.unpack_from("<9i", data, 4 + 36 * i)
        out.append(VelaIo(tuple(shape), elem, offset, region))
    return tuple(out)


def _delegate_size(program, delegate) -> int:
    loc = delegate.processed
    if loc.location == 0:  # INLINE
        return len(program.backend_delegate_data[loc.index].data)
    return program.segments[loc.index].size
