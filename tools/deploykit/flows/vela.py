"""Vela's estimates of an Ethos-U delegate: its network summary and its per-operator report.

Vela prints a network summary (SRAM/DRAM used, MACs, and with --verbose-cycle-estimate its
cycle estimate) and, with --verbose-performance, writes a per-operator report
(`<name>_per-layer.csv`): for each NPU operator its cycles, the cycles of the NPU array and of
each memory's accesses, MACs and MAC utilisation. Neither flag changes the command stream.
`run_vela` compiles a delegate's TOSA graph (`delegate_<i>.tosa`, kept beside the .pte) with
the same flags as ExecuTorch's Ethos-U backend, for another accelerator configuration, memory
mode or system configuration (`deploykit npu-sweep`); `parse_summary` and `parse_per_layer`
read what Vela wrote, for the export (flows/ethos_u_int8.py) and the sweep alike.
"""

from __future__ import annotations

import contextlib
import csv
import io
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.util.errors import ConfigError, ExportError

# Vela's --output-dir holds `<tosa file stem>_per-layer.csv`; arm_vela.py names the file out.tosa.
PER_LAYER_CSV = "out_per-layer.csv"
VELA_FLAGS = ("--verbose-cycle-estimate", "--verbose-performance")

SUMMARY_KEYS = {
    "Accelerator configuration": "accelerator_config",
    "System configuration": "system_config",
    "Memory mode": "memory_mode",
    "Total SRAM used": "sram_used_kib",
    "Total DRAM used": "dram_used_kib",
    "CPU operators": "cpu_operators",
    "NPU operators": "npu_operators",
    "Neural network macs": "network_macs",
    "Accelerator clock": "clock_mhz",
    # With --verbose-cycle-estimate: Vela's performance model of the command stream.
    "NPU cycles": "npu_cycles",
    "SRAM Access cycles": "sram_access_cycles",
    "DRAM Access cycles": "dram_access_cycles",
    "Total cycles": "total_cycles",
    "Total   SRAM bandwidth": "sram_mb",
    "Total   DRAM bandwidth": "dram_mb",
    # Systems with flash behind AXI1 (the U55's Embedded ones): the weights' traffic is here.
    "Total   Off-chip Flash bandwidth": "off_chip_flash_mb",
    "Total   On-chip Flash bandwidth": "on_chip_flash_mb",
    "Batch Inference time": "inference_ms",
}

# Per-layer CSV columns -> the access cycles of each memory, named as a user knows them.
_ACCESS_COLUMNS = {"SRAM AC": "SRAM", "DRAM AC": "DRAM", "OnFlash AC": "on-chip flash",
                   "OffFlash AC": "off-chip flash"}


def parse_summary(text: str) -> dict[str, Any]:
    """The labelled figures of Vela's network summary. A label's first line wins: the per-batch
    traffic comes before the same label's "per input" line."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        for label, key in SUMMARY_KEYS.items():
            if line.startswith(label) and key not in out:
                value = line[len(label):].strip().lstrip("=").strip()
                number = value.split()[0] if value else ""
                try:
                    out[key] = float(number) if "." in number else int(number)
                except ValueError:
                    out[key] = value
    return out


def parse_per_layer(text: str, model_lines: dict[str, str] | None = None
                    ) -> list[dict[str, Any]]:
    """Vela's per-layer CSV as one record per NPU operator, in command-stream order.

    `cycles` is the operator's estimate (Vela's "Op Cycles": the longest of the NPU array's
    cycles and each memory's access cycles); `bound` says which of them it is: "compute" when
    the array's, else the memory whose traffic takes longest. `model_lines` maps a TOSA node
    name to the model line it came from, where the export knows it."""
    rows = list(csv.DictReader(io.StringIO(text)))
    layers = []
    for row in rows:
        if row.get("Target", "NPU") != "NPU":
            continue
        npu = _int(row.get("NPU"))
        access = {label: _int(row.get(col)) for col, label in _ACCESS_COLUMNS.items()}
        slowest = max(access, key=lambda k: access[k])
        bound = "compute" if npu >= access[slowest] else slowest
        name = row.get("Name", "")
        layers.append({
            "op": row.get("Original Operator", ""),
            "name": name,
            "model_line": (model_lines or {}).get(name),
            "cycles": _int(row.get("Op Cycles")),
            "npu_cycles": npu,
            "sram_cycles": access["SRAM"],
            "dram_cycles": access["DRAM"],
            "macs": _int(row.get("MAC Count")),
            "mac_utilisation": _float(row.get("Util% (MAC)")) / 100.0,
            "bound": bound,
        })
    return layers


def _int(value: str | None) -> int:
    try:
        return int(float(value or 0))
    except ValueError:
        return 0


def _float(value: str | None) -> float:
    try:
        number = float(value or 0)
    except ValueError:
        return 0.0
    return 0.0 if number != number else number  # Vela writes NaN where it has no MACs


@dataclass(frozen=True)
class VelaRun:
    """One Vela compilation of one delegate's TOSA graph."""

    summary: dict[str, Any]
    layers: list[dict[str, Any]]
    binary: bytes  # the delegate blob, as the backend would store it in the .pte
    seconds: float  # wall time of Vela's compile


def compiler_flags(target: str, system_config: str, memory_mode: str) -> list[str]:
    """The flags ExecuTorch's Ethos-U backend gives Vela (EthosUCompileSpec builds them)."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    return list(EthosUCompileSpec(target, system_config=system_config,
                                  memory_mode=memory_mode).compiler_flags)


def compile_with_report(compile_fn: Any, tosa: bytes, flags: list[str], *args: Any,
                        intermediate_path: str | None = None, **kwargs: Any
                        ) -> tuple[bytes, str, str]:
    """(binary, what Vela printed, its per-layer CSV) of `compile_fn` (arm_vela's
    vela_compile) with the estimate flags added. Vela writes the CSV into its output folder,
    which lives in `intermediate_path` when the backend keeps one, else in a temporary one."""
    printed = io.StringIO()
    with contextlib.ExitStack() as stack:
        folder = intermediate_path or stack.enter_context(tempfile.TemporaryDirectory())
        with contextlib.redirect_stdout(printed):
            binary = compile_fn(tosa, [*flags, *VELA_FLAGS], *args,
                                intermediate_path=folder, **kwargs)
        csv_path = Path(folder) / "output" / PER_LAYER_CSV
        per_layer = csv_path.read_text() if csv_path.is_file() else ""
    return bytes(binary), printed.getvalue(), per_layer


def run_vela(tosa: bytes, target: str, system_config: str, memory_mode: str,
             model_lines: dict[str, str] | None = None) -> VelaRun:
    """Compile `tosa` with Vela as the Ethos-U backend does, with its estimates. A
    configuration Vela's vela.ini does not know is a ConfigError naming it."""
    from ethosu.vela.errors import CliOptionError, ConfigOptionError
    from executorch.backends.arm.arm_vela import vela_compile

    flags = compiler_flags(target, system_config, memory_mode)
    start = time.monotonic()
    try:
        binary, printed, per_layer = compile_with_report(vela_compile, tosa, flags)
    except (CliOptionError, ConfigOptionError, SystemExit) as exc:
        # An option value Vela's vela.ini does not know (its argument parser may also exit).
        raise ConfigError(f"Vela refused {target}, {system_config}, {memory_mode}: "
                          f"{str(exc).strip()[:300]}",
                          "Use a system configuration and memory mode of Vela's Arm/vela.ini "
                          "(the board file's npu.vela lists them).") from exc
    except Exception as exc:
        raise ExportError(f"Vela failed for {target}, {system_config}, {memory_mode}: "
                          f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                          "See Vela's message; another configuration may compile.") from exc
    seconds = time.monotonic() - start
    return VelaRun(summary=parse_summary(printed), layers=parse_per_layer(per_layer, model_lines),
                   binary=binary, seconds=seconds)
