"""The board self-test: board support + protocol on the real simulator, without ExecuTorch.

firmware/selftest/selftest.c computes an int32 matrix product and a float32 vector function
from a documented LCG stream; the host recomputes both with numpy and requires bit equality.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deploykit.build.firmware import Firmware
from deploykit.build.render import render_board_files
from deploykit.families import family_of
from deploykit.readers.boards import Board
from deploykit.readers.protocol import RunRecords
from deploykit.run.runners import RunResult, runner_for_board
from deploykit.util.errors import ExitCode

LCG_SEED = 0x2545F491


def expected_outputs() -> list[np.ndarray]:
    """The selftest's outputs, recomputed exactly as documented in selftest.c."""
    state = LCG_SEED

    def lcg() -> int:
        nonlocal state
        state = (1664525 * state + 1013904223) & 0xFFFFFFFF
        return state

    a = np.array([(lcg() >> 24) - 128 for _ in range(24 * 32)], np.int32).reshape(24, 32)
    b = np.array([(lcg() >> 24) - 128 for _ in range(32 * 20)], np.int32).reshape(32, 20)
    x = np.array([((lcg() >> 8) & 0xFFFF) - 32768 for _ in range(64)],
                 np.float32) / np.float32(4096)
    c = a @ b
    y = np.sqrt(x * x + np.float32(1)) * np.float32(0.5) - x / np.float32(3)
    return [c, y.astype(np.float32)]


@dataclass
class SelftestReport:
    board: str
    firmware: Firmware
    passed: bool
    exit_code: ExitCode
    problems: list[str] = field(default_factory=list)
    ticks: int | None = None
    instructions_estimate: float | None = None
    stack_used: int | None = None
    wall_seconds: float = 0.0
    records: RunRecords | None = field(default=None, repr=False, metadata={"json": False})
    hang: str | None = None  # the hang variant: where the CPU was when the limit expired

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [f"selftest on {self.board}: {verdict}",
                 f"  elf {self.firmware.elf} ({self.firmware.sizes.flash_total:,} B flash)"]
        if self.ticks is not None:
            lines.append(f"  ticks {self.ticks:,}"
                         + (f", ~{self.instructions_estimate:,.0f} instructions (icount)"
                            if self.instructions_estimate else ""))
        if self.stack_used is not None:
            lines.append(f"  stack high-water {self.stack_used:,} B")
        if self.hang:
            lines.append(f"  {self.hang}")
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


# Self-test variants: what the firmware does on purpose (DK_SELFTEST_FAULT), and the run
# outcome that proves the whole path reports it.
VARIANTS = {"ok": (0, ExitCode.OK), "fault": (1, ExitCode.FAULT),
            "stack-overflow": (2, ExitCode.FAULT), "error": (3, ExitCode.DEVICE_ERROR),
            "hang": (4, ExitCode.TIMEOUT)}


def run_selftest(board: Board, out: Path, timeout: float, progress: Callable[[str], None],
                 variant: str = "ok", runner_options: dict | None = None) -> SelftestReport:
    """Build and run the self-test. `variant` other than "ok" makes the firmware fault or
    report an error on purpose; the self-test then passes when the host classifies the run
    exactly so (a fault record naming the faulting pc, or an error record and done 1).
    `runner_options`: the runner's keyword arguments (Target.runner_kwargs, pipeline/target.py),
    e.g. a board's port or its labgrid place."""
    mode, expected_outcome = VARIANTS[variant]
    generated = out / "generated"
    render_board_files(board, generated)
    progress(f"building the selftest firmware ({variant}) for {board.name}")
    fw = family_of(board).build_image(board, generated, out / "firmware", "selftest",
                                      {"DK_SELFTEST_FAULT": str(mode)}, progress=progress)
    runner = runner_for_board(board, **(runner_options or {}))
    progress(f"running {fw.elf.name} on {runner.kind}")
    result = runner.run(fw.elf, out, timeout_s=timeout, check=variant == "ok")
    if variant != "ok":
        return _deliberate_failure_report(board, fw, result, expected_outcome)
    problems = []
    records = result.records
    hello = records.hello.fields if records.hello else {}
    if hello.get("board") != board.name:
        problems.append(f"hello names board {hello.get('board')!r}, expected {board.name!r}")
    for i, want in enumerate(expected_outputs()):
        got = records.tensors.get(i)
        if got is None:
            problems.append(f"tensor {i} missing")
        elif got.data.shape != want.shape or got.data.dtype != want.dtype \
                or got.data.tobytes() != want.tobytes():
            problems.append(f"tensor {i} differs from the host's recomputation")
    stack = records.memory.entries.get("stack") if records.memory else None
    return SelftestReport(
        board=board.name, firmware=fw, passed=not problems,
        exit_code=ExitCode.MISMATCH if problems else ExitCode.OK, problems=problems,
        ticks=records.timing.ticks if records.timing else None,
        instructions_estimate=result.instructions_estimate,
        stack_used=stack[0] if stack else None, wall_seconds=result.wall_seconds,
        records=records)


def _deliberate_failure_report(board: Board, fw: Firmware, result: RunResult,
                               expected: ExitCode) -> SelftestReport:
    outcome = result.outcome()
    problems = []
    if outcome.exit_code != expected:
        problems.append(f"the run was classified {outcome.exit_code.name} ({outcome.cause}), "
                        f"expected {expected.name}")
    fault = result.records.fault
    if expected == ExitCode.FAULT and fault is not None and fault.registers["pc"]:
        site = _symbol_address(fw.elf, "dk_selftest_fault_site")
        if site is not None and fault.registers["pc"] != site:
            problems.append(f"fault pc 0x{fault.registers['pc']:08x} is not the fault site "
                            f"0x{site:08x}")
    if expected == ExitCode.TIMEOUT and result.runner == "QEMU" and (
            "dk_selftest_hang_site" not in (result.hang or "")):
        # QEMU is asked where the CPU is when the limit expires (runners/hang.py).
        problems.append(f"the hang was not located in dk_selftest_hang_site: "
                        f"{result.hang or '; '.join(result.notes) or 'no location'}")
    return SelftestReport(
        board=board.name, firmware=fw, passed=not problems,
        exit_code=ExitCode.MISMATCH if problems else ExitCode.OK, problems=problems,
        wall_seconds=result.wall_seconds, records=result.records, hang=result.hang)


def _symbol_address(elf: Path, name: str) -> int | None:
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        found = symtab.get_symbol_by_name(name) if symtab else None
        return found[0]["st_value"] & ~1 if found else None
