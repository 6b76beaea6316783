"""Where a hung target is: its CPU registers read through QEMU's monitor protocol (QMP), and
the PC and LR mapped to function, file and line through the ELF's symbols and DWARF line table.

QEMU runs with `-qmp unix:<socket>,server=on,wait=off`. When a run's time limit expires, the
runner calls `locate_hang()` before it kills QEMU: `stop` freezes the CPU, and the monitor's
`info registers` gives R14 (LR) and R15 (PC). A PC in a leaf loop is the loop; LR is where
that function was called from (in a function that calls others, LR may be stale: it says so).

Profiling firmware (DK_PROFILE_EVENTS) also says where in the program it was: its last
`trace_event` records name the last operator that ended, and the program embedded in the ELF
(`dk_model_pte`) gives the operators' names and count (`operator_position`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from deploykit.readers.protocol.records import TraceEvent

# Where a source file comes from, by a fragment of its path (first match wins).
COMPONENTS = (
    ("cmsis-nn", "CMSIS-NN"),
    ("cmsis_nn", "CMSIS-NN"),
    ("ethos-u", "Ethos-U driver"),
    ("ethos_u", "Ethos-U driver"),
    ("executorch", "ExecuTorch"),
    ("pico-sdk", "pico-sdk"),
    ("newlib", "newlib"),
    ("firmware/", "deploykit firmware"),
)
# The same by symbol name, for code built without line information (the cached runtime).
SYMBOL_COMPONENTS = (
    ("arm_", "CMSIS-NN"),
    ("ethosu_", "Ethos-U driver"),
    ("_ZN10executorch", "ExecuTorch"),
    ("_ZN5torch8executor", "ExecuTorch"),
    ("_ZN2c10", "ExecuTorch"),
)
QMP_TIMEOUT_S = 5.0
EXC_RETURN_MIN = 0xFF000000  # LR values from here are EXC_RETURN codes, not addresses


@dataclass(frozen=True)
class CodeLocation:
    address: int
    function: str | None  # the ELF symbol that contains the address, demangled
    file: str | None
    line: int | None
    symbol: str | None = None  # the symbol as the ELF spells it

    @property
    def component(self) -> str | None:
        path = (self.file or "").lower()
        by_path = next((label for frag, label in COMPONENTS if frag in path), None)
        return by_path or next(
            (
                label
                for prefix, label in SYMBOL_COMPONENTS
                if (self.symbol or "").startswith(prefix)
            ),
            None,
        )

    def describe(self) -> str:
        name = self.function or f"0x{self.address:08x} (no symbol)"
        where = f"{Path(self.file).name}:{self.line}" if self.file and self.line else None
        extra = ", ".join(x for x in (self.component, where) if x)
        return f"{name} ({extra})" if extra else name


@dataclass(frozen=True)
class HangLocation:
    pc: int
    lr: int
    at: CodeLocation
    caller: CodeLocation | None  # None when LR is an exception return

    def describe(self) -> str:
        text = f"Hung in {self.at.describe()} at pc=0x{self.pc:08x}"
        if self.caller is None:
            return text + f", in an exception handler (lr=0x{self.lr:08x})"
        return text + f", called from {self.caller.describe()} (lr=0x{self.lr:08x})"


class ElfLocator:
    """Address -> function and file:line of one ELF (symbols, .debug_aranges, .debug_line)."""

    def __init__(self, elf: Path) -> None:
        from elftools.elf.elffile import ELFFile

        self._file = open(elf, "rb")  # noqa: SIM115 - pyelftools reads it lazily
        self._elf = ELFFile(self._file)
        functions = []
        symtab = self._elf.get_section_by_name(".symtab")
        for sym in symtab.iter_symbols() if symtab else ():
            if sym["st_info"]["type"] == "STT_FUNC" and sym.name:
                functions.append((sym["st_value"] & ~1, sym["st_size"], sym.name))
        functions.sort()
        self._starts = [f[0] for f in functions]
        self._functions = functions
        self._dwarf = self._elf.get_dwarf_info() if self._elf.has_dwarf_info() else None

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ElfLocator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def function_at(self, address: int) -> str | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        start, size, name = self._functions[i]
        return name if address < start + max(size, 1) else None

    def line_at(self, address: int) -> tuple[str | None, int | None]:
        if self._dwarf is None:
            return None, None
        cu_offset = None
        with contextlib.suppress(Exception):
            aranges = self._dwarf.get_aranges()
            cu_offset = aranges.cu_offset_for_addr(address) if aranges else None
        cus = (
            [self._dwarf.get_CU_at(cu_offset)] if cu_offset is not None else self._dwarf.iter_CUs()
        )
        for cu in cus:
            found = _line_in(self._dwarf, cu, address)
            if found is not None:
                return found
        return None, None

    def locate(self, address: int) -> CodeLocation:
        file, line = self.line_at(address)
        symbol = self.function_at(address)
        return CodeLocation(address, _demangle(symbol), file, line, symbol)


def _demangle(symbol: str | None) -> str | None:
    """A C++ symbol as a reader knows it (the toolchain's c++filt), without its arguments."""
    if symbol is None or not symbol.startswith("_Z"):
        return symbol
    tool = shutil.which("arm-none-eabi-c++filt") or shutil.which("c++filt")
    if tool is None:
        return symbol
    try:
        out = subprocess.run(
            [tool, symbol], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return symbol
    return re.sub(r"\([^()]*\)( const)?$", "", out) or symbol  # without the argument list


def _line_in(dwarf, cu, address: int) -> tuple[str, int] | None:
    program = dwarf.line_program_for_CU(cu)
    if program is None:
        return None
    previous = None
    for entry in program.get_entries():
        state = entry.state
        if state is None:
            continue
        if previous is not None and previous.address <= address < state.address:
            return _file_name(program, previous.file), previous.line
        previous = None if state.end_sequence else state
    return None


def _file_name(program, index: int) -> str:
    files = program["file_entry"]
    version = program["version"]
    entry = files[index if version >= 5 else index - 1]
    name = entry.name.decode(errors="replace")
    dirs = program["include_directory"]
    d = entry.dir_index if version >= 5 else entry.dir_index - 1
    if 0 <= d < len(dirs) and not name.startswith("/"):
        return f"{dirs[d].decode(errors='replace')}/{name}"
    return name


def locate(elf: Path, pc: int, lr: int) -> HangLocation:
    """PC and LR mapped in `elf`. LR points after the call (Thumb bit set): the call itself
    is 2 bytes before it, which keeps a call at the very end of a function in it."""
    with ElfLocator(elf) as loc:
        caller = None if lr >= EXC_RETURN_MIN else loc.locate((lr & ~1) - 2)
        return HangLocation(pc, lr, loc.locate(pc & ~1), caller)


REGISTER = re.compile(r"\bR(1[45])=([0-9a-fA-F]{8})")


def parse_registers(text: str) -> tuple[int, int]:
    """(pc, lr) from the monitor's `info registers` of an Arm CPU."""
    regs = {int(n): int(v, 16) for n, v in REGISTER.findall(text)}
    if 14 not in regs or 15 not in regs:
        raise ValueError(f"no R14/R15 in the monitor's answer: {text[:200]!r}")
    return regs[15], regs[14]


async def _query(socket_path: str) -> str:
    from qemu.qmp import QMPClient

    client = QMPClient("deploykit")
    await client.connect(socket_path)
    try:
        await client.execute("stop")
        return str(
            await client.execute("human-monitor-command", {"command-line": "info registers"})
        )
    finally:
        await client.disconnect()


def query_registers(socket_path: str, timeout_s: float = QMP_TIMEOUT_S) -> tuple[int, int]:
    """Freeze the CPU of the QEMU behind `socket_path` and return its (pc, lr)."""
    text = asyncio.run(asyncio.wait_for(_query(socket_path), timeout_s))
    return parse_registers(text)


def locate_hang(socket_path: str, elf: Path) -> tuple[HangLocation | None, str]:
    """Where the target is, or None and why not (never raises: a run that hangs must still
    be reported as a timeout)."""
    try:
        pc, lr = query_registers(socket_path)
    except Exception as exc:  # noqa: BLE001 - any QMP failure leaves the plain timeout
        return None, f"QEMU's monitor (QMP) did not give the registers: {exc!r}"
    try:
        return locate(elf, pc, lr), ""
    except Exception as exc:  # noqa: BLE001
        return None, f"pc=0x{pc:08x} lr=0x{lr:08x} could not be mapped in {elf}: {exc!r}"


MODEL_SYMBOL = "dk_model_pte"  # the embedded program (templates/model_pte.c.j2)
OPERATOR_EVENTS = ("OPERATOR_CALL", "DELEGATE_CALL")
EXECUTE_EVENT = "Method::execute"


def embedded_program(elf: Path) -> bytes:
    """The .pte bytes the firmware embeds, read from the ELF by its symbol."""
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        image = ELFFile(f)
        symtab = image.get_section_by_name(".symtab")
        symbols = symtab.get_symbol_by_name(MODEL_SYMBOL) if symtab else None
        if not symbols:
            raise ValueError(f"{elf} has no {MODEL_SYMBOL} symbol")
        address, size = symbols[0]["st_value"], symbols[0]["st_size"]
        for section in image.iter_sections():
            start = section["sh_addr"]
            if (
                section["sh_type"] == "SHT_PROGBITS"
                and start <= address < start + section["sh_size"]
            ):
                offset = address - start
                return section.data()[offset : offset + size]
    raise ValueError(f"{MODEL_SYMBOL} of {elf} lies in no section with contents")


def operator_position(elf: Path, events: Sequence[TraceEvent]) -> str:
    """Where in the program a run of profiling firmware was, from the events it sent (each
    sent when it ends): "after operator k of N (name)" and the operator that had not ended."""
    from deploykit.readers.trace import program_instructions

    instructions = program_instructions(embedded_program(elf))
    order = sorted(instructions)  # (chain, instruction index): the order execute() runs them
    total = len(order)
    last = next((e for e in reversed(events) if e.name in OPERATOR_EVENTS + (EXECUTE_EVENT,)), None)
    executes = sum(1 for e in events if e.name == EXECUTE_EVENT)
    if last is not None and last.name == EXECUTE_EVENT:
        return f"after execute() call {executes} ended (all {total} operators)"
    done = order.index((last.chain, last.debug_handle)) + 1 if last is not None else 0
    where = f"in execute() call {executes + 1}, "
    if done == 0:
        where += f"before operator 1 of {total} ended"
    else:
        where += f"after operator {done} of {total} ({instructions[order[done - 1]].name})"
    if done < total:
        where += f"; operator {done + 1} ({instructions[order[done]].name}) did not end"
    return where


def locate_position(elf: Path, events: Sequence[TraceEvent]) -> tuple[str | None, str]:
    """`operator_position`, or None and why not (never raises, like `locate_hang`)."""
    try:
        return operator_position(elf, events), ""
    except Exception as exc:  # noqa: BLE001 - the timeout is still reported without it
        return None, f"the operator position could not be found: {exc!r}"
