"""The parts of hang location that need no simulator: the monitor's register dump, names of
components from a file or a symbol, and a mapped ELF (the host compiler's, with DWARF)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from deploykit.runners.hang import CodeLocation, ElfLocator, HangLocation, parse_registers

INFO_REGISTERS = """
CPU#0
R00=30007fe0 R01=30007fe0 R02=30008068 R03=0635a355
R12=01010101 R13=30007ff8 R14=110000c7 R15=110000a2
XPSR=01000000 ---- T S priv-thread
"""


def test_pc_and_lr_come_from_the_monitor_dump():
    assert parse_registers(INFO_REGISTERS) == (0x110000A2, 0x110000C7)
    with pytest.raises(ValueError, match="R14/R15"):
        parse_registers("CPU#0\nR00=00000000\n")


@pytest.mark.parametrize(
    ("file", "symbol", "component"),
    [
        (
            "/ws/cmsis-nn/Source/ConvolutionFunctions/arm_convolve_s8.c",
            "arm_convolve_s8",
            "CMSIS-NN",
        ),
        (None, "arm_nn_mat_mult_kernel_s8_s16", "CMSIS-NN"),
        (None, "_ZN10executorch7runtime6Method7executeEv", "ExecuTorch"),
        ("/src/firmware/runner/runner.cpp", "main", "deploykit firmware"),
        (None, "memcpy", None),
    ],
)
def test_component_from_file_or_symbol(file, symbol, component):
    assert CodeLocation(0x1000, symbol, file, 1 if file else None, symbol).component == component


def test_exception_return_is_not_mapped_as_a_caller():
    at = CodeLocation(0x100, "spin", "a.c", 3, "spin")
    text = HangLocation(0x100, 0xFFFFFFBC, at, None).describe()
    assert "exception handler" in text and "Hung in spin (a.c:3)" in text


def test_locator_maps_an_address_to_function_file_and_line(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler (cc or gcc) on PATH")
    src = tmp_path / "spin.c"
    src.write_text(
        "volatile int n;\n"
        "__attribute__((noinline)) void spin(void) {\n"
        "  for (;;) n++;\n"
        "}\n"
        "int main(void) { spin(); return 0; }\n"
    )
    exe = tmp_path / "spin"
    subprocess.run([cc, "-g", "-O1", str(src), "-o", str(exe)], check=True)
    with ElfLocator(exe) as loc:
        start = next(a for a, _, name in loc._functions if name == "spin")
        found = loc.locate(start + 1)
    assert found.function == "spin"
    assert found.file is not None and found.file.endswith("spin.c")
    assert found.line in (2, 3)
