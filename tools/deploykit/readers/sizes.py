"""Size report: flash and RAM by component, from the linker map file and the ELF.

The map says which archive or object every input section came from, so bytes are attributed
to the ExecuTorch runtime core, each kernel library, the kernel registration and registry, the
model data, the runner, the board support and the C library. Whether an output section takes
flash, RAM or both comes from the ELF's section headers (allocated and read-only: flash;
writable with contents: RAM, and flash for its load image; no contents: RAM only), so boards
with their own sections (the pico-sdk's .boot2, .noinit, .scratch_x, ...) are counted right.
The pools are one input section (.dk_pools); the ELF's symbols split it into the method pool,
the temp pool and the planned buffers. The stack and heap are their output sections.

With LTO the map names the LTO partitions (`*.ltrans.o`) instead of the archives: their
sections are attributed by the symbol in the section name (executorch::runtime -> runtime
core, torch::executor::native -> portable kernels, cortex_m -> cortex_m kernels, arm_* ->
CMSIS-NN, dk_* -> board + protocol), which is coarser (one "portable kernels" line).

Ethos-U firmware adds two components, by archive or, with LTO, by symbol: "NPU driver" (Arm's
Ethos-U core driver, libethosu_core_driver.a, ethosu_* / ETHOSU_PMU_*) and "Ethos-U backend"
(ExecuTorch's EthosUBackend, libexecutorch_delegate_ethos_u.a, executorch::backends::arm); the
runner's NPU glue (npu_ethos_u.cpp) counts as runner. Its RAM blocks are the temp pool with the
Vela scratch (.dk_npu_scratch) and the fast arena (.dk_npu_fast).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Without the ELF: output sections that occupy flash (loaded) vs RAM (NOLOAD, bss, or copied).
_FLASH_SECTIONS = (".text", ".rodata", ".vectors", ".dk_model", ".ARM.exidx", ".ARM.extab",
                   ".init_array", ".fini_array", ".preinit_array", ".data", ".got", ".boot2",
                   ".binary_info", ".flash_end", ".tdata")
_RAM_SECTIONS = (".data", ".bss", ".dk_pools", ".dk_npu_scratch", ".dk_npu_fast", ".stack",
                 ".heap", ".got", ".noinit",
                 ".ram_vectors", ".scratch_x", ".scratch_y", ".tdata", ".tbss")

# " .text.foo  0x00001234  0x56 path/libx.a(obj.o)"; the name may be on the line before.
_INPUT = re.compile(r"^ (\.\S+|COMMON)?\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)\s+(\S.*)$")
_INPUT_NAME_ONLY = re.compile(r"^ (\.\S+|COMMON)\s*$")
_FILL = re.compile(r"^ \*fill\*\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)")
# ".text  0x11000000  0xa510 [load address 0x...]"; a long name is alone on its line.
_OUTPUT = re.compile(r"^(\.\S+)\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)")
_OUTPUT_NAME_ONLY = re.compile(r"^(\.\S+)\s*$")
_NUMBERS = re.compile(r"^\s+0x([0-9a-fA-F]+)\s+0x([0-9a-fA-F]+)")

_CLIB = ("libc.a", "libc_nano.a", "libm.a", "libg.a", "libg_nano.a", "libnosys.a",
         "libstdc++.a", "libstdc++_nano.a", "libsupc++.a", "libsupc++_nano.a", "libgcc.a")
_ARCHIVES = {
    "libexecutorch_core.a": "runtime core",
    "libexecutorch.a": "prim ops",
    "libkernels_util_all_deps.a": "kernels util",
    "libcortex_m_kernels.a": "cortex_m kernels",
    "libcortex_m_ops_lib.a": "kernel registration",
    "libcmsis-nn.a": "CMSIS-NN",
    "libdk_model_ops.a": "kernel registration",
    "libdk_board.a": "board + protocol",
    "libethosu_core_driver.a": "NPU driver",
    "libexecutorch_delegate_ethos_u.a": "Ethos-U backend",
}
# LTO partitions: components by the C++ namespace of the section's symbol, or a C prefix.
_LTO_NAMESPACES = (
    (("executorch", "backends", "arm"), "Ethos-U backend"),
    (("cortex_m",), "cortex_m kernels"),
    (("torch", "executor", "native"), "portable kernels"),
    # the generated kernel wrappers; LTO inlines the kernels they call into them
    (("torch", "executor", "function"), "kernels (inlined into their registration)"),
    (("torch",), "kernels util"),
    (("c10",), "kernels util"),
    (("executorch",), "runtime core"),
    (("executorch_flatbuffer",), "runtime core"),
    (("flatbuffers",), "runtime core"),
)
_LTO_C_PREFIXES = (
    # Ethos-U firmware: Arm's driver (C), ExecuTorch's backend (its C symbols), the runner's glue
    # (the driver's ethosu_mutex_create hands out a static mutex_placeholder)
    *((p, "NPU driver") for p in ("ethosu_", "ETHOSU_PMU_", "eventbyid", "pmu_event_",
                                  "mutex_placeholder")),
    *((p, "Ethos-U backend") for p in ("executorch_delegate_EthosUBackend",
                                        "arm_ethos_io_memcpy")),
    *((p, "runner") for p in ("dk_npu_", "EthosUBackend_execute_")),
    ("arm_", "CMSIS-NN"),
    ("dk_model_pte", "model data"),
    ("dk_input", "model inputs"),
    ("dk_expected", "model inputs"),
    ("dk_", "board + protocol"),
    ("set", "model inputs"),  # set<k>_input_<i>_data: the embedded input sets
    ("expected_", "model inputs"),
    ("et_pal_", "runner"),
    ("main", "runner"),  # with LTO, main also holds what was inlined into it
    ("_sub_I_", "kernel registration"),  # static constructors: the kernel registrations
    *((p, "C/C++ library") for p in (
        "__wrap_", "_out_char", "snprintf", "vsnprintf", "printf", "_printf", "_vfprintf",
        "_svfprintf", "str", "mem", "abort", "malloc", "free", "_malloc", "_free", "calloc",
        "realloc", "__aeabi", "__gnu", "_impure", "errno", "__errno", "atexit", "__cxa",
        "_sbrk", "_write", "_read", "_close", "_lseek", "_fstat", "_isatty", "_exit", "_kill",
        "_getpid", "_init", "_fini", "__libc", "_ZdlPv", "_Znwj", "_ZSt")),
    # pico-sdk and TinyUSB (Pico 2 boards)
    *((p, "pico-sdk") for p in (
        "tud_", "tu_", "usbd_", "_usbd", "dcd_", "cdcd_", "_cdcd", "vendord_", "_vendord",
        "resetd_", "stdio_", "alarm_pool", "default_alarm", "irq_", "runtime_init", "clock",
        "pll_", "hw_", "mutex_", "low_priority", "configuration_reset", "desc_", "gpio_",
        "uart_", "time_", "timer_", "spin_", "sem_", "critical_section", "panic",
        "ram_vector_table", "xosc_", "watchdog_", "flash_", "rom_", "boot_")),
)
_TOKEN = re.compile(r"(\d+)")


def _namespaces(symbol: str) -> tuple[str, ...]:
    """The leading names of a mangled C++ symbol: _ZN10executorch7runtime... -> (executorch,
    runtime, ...)."""
    m = re.match(r"^_Z(?:T[VIS])?Z*N[KVRO]*", symbol)
    if not m:
        return ()
    rest, names = symbol[m.end():], []
    while rest and rest[0].isdigit() and len(names) < 4:
        digits = _TOKEN.match(rest).group(1)
        n = int(digits)
        names.append(rest[len(digits):len(digits) + n])
        rest = rest[len(digits) + n:]
    return tuple(names)


POOL_SYMBOLS = {"method_pool": "method pool", "temp_pool": "temp pool",
                "planned_pool": "planned buffers"}
# Ethos-U firmware: the temp pool holds the Vela scratch too, in its own section.
NPU_SCRATCH_SECTION, NPU_FAST_SECTION = ".dk_npu_scratch", ".dk_npu_fast"
NPU_POOL_SYMBOLS = {"temp_pool": "temp pool + Ethos-U scratch"}
NPU_FAST_LABEL = "Ethos-U fast arena"
POOL_SECTIONS = (".dk_pools", NPU_SCRATCH_SECTION)


def component_of(origin: str, section: str) -> str:
    """Name the component an input section belongs to."""
    path = origin.split("(")[0].strip()
    name = Path(path).name
    member = origin[len(path):].strip("() ") if "(" in origin else ""
    if section.startswith(".dk_model") or "model_pte" in origin:
        return "model data"
    if section.startswith((".dk_pools", NPU_SCRATCH_SECTION)):
        return "pools"
    if section.startswith(NPU_FAST_SECTION):
        return NPU_FAST_LABEL
    if "model_io" in origin:
        return "model inputs"
    if name in _CLIB or name.startswith(("crt", "libc_", "libg_")) or name in (
            "crti.o", "crtn.o", "crtbegin.o", "crtend.o"):
        return "C/C++ library"
    if name in _ARCHIVES:
        return _ARCHIVES[name]
    if name.startswith("libdk_portable_op_") and name.endswith(".a"):
        return "portable op " + name[len("libdk_portable_op_"):-2]
    if name.startswith("libportable_kernels") or name.startswith("libportable_ops"):
        return "portable kernels"
    if "RegisterCodegenUnboxedKernels" in name:  # dk_model_ops, linked as objects
        return "kernel registration"
    if "operator_registry" in path:
        return "kernel registry"
    if "ltrans" in name or name.endswith(".ltrans.o") or "lto" in name.split(".")[-2:]:
        return _lto_component(section, member)
    if "/pico-sdk/" in path or "/tinyusb/" in path or name.startswith(("libpico", "libhardware")):
        return "pico-sdk"
    if "/firmware/boards/" in path or "/firmware/protocol/" in path or name.startswith(
            ("dk_protocol", "startup.S")):
        return "board + protocol"
    if "runner.cpp" in name or "lean_libc" in name or "/firmware/runner/" in path:
        return "runner"
    if name.startswith("lib") and name.endswith(".a"):
        return name[3:-2]
    return "runner" if name.endswith((".obj", ".o")) else name or "other"


def _lto_component(section: str, member: str) -> str:
    symbol = section.split(".", 2)[-1] if section.count(".") >= 2 else ""
    for prefix in ("unlikely.", "startup.", "hot."):
        symbol = symbol.removeprefix(prefix)
    if symbol.startswith(("_ZZ4main", "_ZZ4mainE")):
        return "runner"
    if symbol.startswith(("_ZSt", "_ZNSt", "_ZNKSt", "_ZNKRSt", "_ZNSt", "_ZNKOSt")):
        return "C/C++ library"
    names = _namespaces(symbol)
    for prefix, comp in _LTO_NAMESPACES:
        if names[:len(prefix)] == prefix:
            return comp
    if names[:1] == ("_GLOBAL__N_1",) or symbol in ("main", "_ZN12_GLOBAL__N_1"):
        return "runner"
    if section.startswith(".time_critical"):
        return "pico-sdk"
    for prefix, comp in _LTO_C_PREFIXES:
        if symbol.startswith(prefix):
            return comp
    return "LTO (unattributed)"


@dataclass
class SizeReport:
    flash_by_component: dict[str, int] = field(default_factory=dict)
    ram_by_component: dict[str, int] = field(default_factory=dict)
    sections: dict[str, int] = field(default_factory=dict)
    # RAM blocks: pools by symbol (method pool, temp pool, planned buffers), stack, heap
    pools: dict[str, int] = field(default_factory=dict)
    stack: int = 0
    heap: int = 0
    lto: bool = False  # the map names LTO partitions: attribution by symbol, coarser

    @property
    def flash_total(self) -> int:
        return sum(self.flash_by_component.values())

    @property
    def ram_total(self) -> int:
        return sum(self.ram_by_component.values())

    @property
    def static_data(self) -> int:
        """.data and .bss (and the like): RAM other than the pools, the stack and the heap."""
        blocks = set(self.pools) | {"stack", "heap", "pools"}
        return sum(v for k, v in self.ram_by_component.items() if k not in blocks)

    def code_excluding_model(self) -> int:
        return sum(v for k, v in self.flash_by_component.items()
                   if k not in ("model data", "model inputs"))

    def table(self) -> str:
        lines = [f"{'flash':<28}{'bytes':>12}"]
        for k, v in sorted(self.flash_by_component.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {k:<26}{v:>12,}")
        lines.append(f"  {'total':<26}{self.flash_total:>12,}")
        lines.append(f"{'RAM':<28}{'bytes':>12}")
        for k, v in sorted(self.ram_by_component.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append(f"  {k:<26}{v:>12,}")
        lines.append(f"  {'total':<26}{self.ram_total:>12,}")
        return "\n".join(lines)


def _copied(section, loads: list) -> bool:
    """Whether a section with contents runs at another address than the one it loads at."""
    addr = section["sh_addr"]
    for seg in loads:
        if seg["p_vaddr"] <= addr < seg["p_vaddr"] + max(seg["p_memsz"], 1):
            return seg["p_paddr"] != seg["p_vaddr"]
    return False


def _elf_layout(elf: Path) -> tuple[dict[str, tuple[bool, bool]], dict[str, int]]:
    """(output section -> (takes flash, takes RAM), pool symbol -> size) from the ELF."""
    from elftools.elf.constants import SH_FLAGS
    from elftools.elf.elffile import ELFFile

    kinds: dict[str, tuple[bool, bool]] = {}
    pools: dict[str, int] = {}
    with open(elf, "rb") as f:
        e = ELFFile(f)
        loads = [seg for seg in e.iter_segments() if seg["p_type"] == "PT_LOAD"]
        for sec in e.iter_sections():
            flags = sec["sh_flags"]
            if not flags & SH_FLAGS.SHF_ALLOC:
                continue
            nobits = sec["sh_type"] == "SHT_NOBITS"
            # Contents are in the image (flash); contentless sections are RAM, and so is a
            # section with contents that runs elsewhere than it loads (.data: its load image
            # in flash, copied to RAM at reset). Being writable is not enough: the pico-sdk
            # keeps .init_array and the like, writable, in flash where they load.
            kinds[sec.name] = (not nobits, nobits or _copied(sec, loads))
        symtab = e.get_section_by_name(".symtab")
        for name, labels in ((".dk_pools", POOL_SYMBOLS), (NPU_SCRATCH_SECTION, NPU_POOL_SYMBOLS)):
            pools_sec = e.get_section_by_name(name)
            if symtab is None or pools_sec is None or not pools_sec["sh_size"]:
                continue
            lo, hi = pools_sec["sh_addr"], pools_sec["sh_addr"] + pools_sec["sh_size"]
            for sym in symtab.iter_symbols():
                if sym["st_info"]["type"] != "STT_OBJECT" or not lo <= sym["st_value"] < hi:
                    continue
                for key, label in labels.items():
                    if key in sym.name:
                        pools[label] = pools.get(label, 0) + int(sym["st_size"])
    return kinds, pools


def size_report(map_file: Path, elf: Path | None = None) -> SizeReport:
    """Attribute every allocated input section of the link to a component. `elf` (default:
    the map's name with .elf) decides flash/RAM per output section and splits the pools."""
    report = SizeReport()
    elf = elf or map_file.with_suffix(".elf")
    kinds: dict[str, tuple[bool, bool]] | None = None
    if elf.exists():
        kinds, report.pools = _elf_layout(elf)

    def takes(output: str) -> tuple[bool, bool]:
        if kinds is not None:
            return kinds.get(output, (False, False))
        return (output.startswith(_FLASH_SECTIONS), output.startswith(_RAM_SECTIONS))

    flash: dict[str, int] = defaultdict(int)
    ram: dict[str, int] = defaultdict(int)
    output: str | None = None
    pending_output: str | None = None
    pending_input: str | None = None
    in_map = False
    for line in map_file.read_text(errors="replace").splitlines():
        if line.startswith("Linker script and memory map"):
            in_map = True
            continue
        if not in_map or not line.strip():
            continue
        if pending_output is not None:
            m = _NUMBERS.match(line)
            if m:
                output = pending_output
                report.sections[output] = int(m.group(2), 16)
                pending_output = None
                continue
            pending_output = None
        if not line.startswith(" "):
            m = _OUTPUT.match(line)
            if m:
                output = m.group(1)
                report.sections[output] = int(m.group(3), 16)
                continue
            m = _OUTPUT_NAME_ONLY.match(line)
            output = None
            if m:
                pending_output = m.group(1)
            continue
        if output is None:
            continue
        m = _INPUT_NAME_ONLY.match(line)
        if m:
            pending_input = m.group(1)
            continue
        m = _INPUT.match(line)
        fill = _FILL.match(line)
        if m:
            section = m.group(1) or pending_input or output
            addr, size, origin = int(m.group(2), 16), int(m.group(3), 16), m.group(4)
            comp = component_of(origin, section)
            report.lto = report.lto or "ltrans" in origin
        elif fill:
            addr, size, comp = int(fill.group(1), 16), int(fill.group(2), 16), "alignment"
        else:
            continue
        pending_input = None
        if size == 0 or (addr == 0 and kinds is None):
            continue
        in_flash, in_ram = takes(output)
        if in_flash:
            flash[comp] += size
        # The reserved blocks (pools, stack, heap) are counted below, alignment included.
        if in_ram and output not in (".stack", ".heap", *POOL_SECTIONS):
            ram[comp] += size
    # The reserved blocks by what they are.
    pools_total = sum(report.sections.get(s, 0) for s in POOL_SECTIONS)
    if report.pools:
        for label, size in report.pools.items():
            ram[label] += size
        rest = pools_total - sum(report.pools.values())
        if rest > 0:
            ram["alignment"] += rest
    elif pools_total:
        ram["pools"] += pools_total
    report.stack = report.sections.get(".stack", 0)
    report.heap = report.sections.get(".heap", 0)
    for name, size in (("stack", report.stack), ("heap", report.heap)):
        if size:
            ram[name] = size
    report.flash_by_component = {k: v for k, v in flash.items() if v}
    report.ram_by_component = {k: v for k, v in ram.items() if v}
    return report
