"""The parts of hang location that need no simulator: the monitor's register dump, names of
components from a file or a symbol, and a mapped ELF (the host compiler's, with DWARF)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from deploykit.run.runners.hang import CodeLocation, ElfLocator, HangLocation, parse_registers

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


def _elf_with_program(tmp_path, pte: bytes):
    """A host ELF that embeds `pte` as dk_model_pte, the way templates/model_pte.c.j2 does."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no host C compiler (cc or gcc) on PATH")
    (tmp_path / "model.pte").write_bytes(pte)
    src = tmp_path / "model_pte.c"
    src.write_text(
        '__asm__("\\t.section .dk_model,\\"a\\",%progbits\\n\\t.balign 16\\n"\n'
        '        "\\t.global dk_model_pte\\n\\t.type dk_model_pte, %object\\n"\n'
        '        "dk_model_pte:\\n\\t.incbin \\"model.pte\\"\\n"\n'
        '        "\\t.size dk_model_pte, . - dk_model_pte\\n\\t.previous\\n");\n'
        "int main(void) { return 0; }\n"
    )
    exe = tmp_path / "model"
    subprocess.run([cc, f"-Wa,-I{tmp_path}", str(src), "-o", str(exe)], check=True)
    return exe


def test_operator_position_from_the_events_and_the_embedded_program(tmp_path):
    import torch
    from executorch.exir import to_edge

    from deploykit.readers.protocol.records import TraceEvent
    from deploykit.readers.trace import program_instructions
    from deploykit.run.runners.hang import embedded_program, operator_position

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    exported = torch.export.export(model.eval(), (torch.zeros(1, 4),))
    pte = to_edge(exported).to_executorch().buffer
    elf = _elf_with_program(tmp_path, pte)
    assert embedded_program(elf) == pte
    instructions = program_instructions(pte)
    order = sorted(instructions)
    names = [instructions[k].name for k in order]
    n = len(order)
    assert n >= 3

    def op(k: int) -> TraceEvent:  # the event of the k-th operator (0-based) ending
        chain, index = order[k]
        return TraceEvent("OPERATOR_CALL", chain, index, -1, 10 * k, 10 * k + 5)

    native = TraceEvent(f"native_call_{names[1]}", *order[1], -1, 11, 14)
    assert operator_position(elf, [op(0), native, op(1)]) == (
        f"in execute() call 1, after operator 2 of {n} ({names[1]}); "
        f"operator 3 ({names[2]}) did not end"
    )
    assert operator_position(elf, []) == (
        f"in execute() call 1, before operator 1 of {n} ended; operator 1 ({names[0]}) did not end"
    )
    done = TraceEvent("Method::execute", -1, 0, -1, 0, 10 * n)
    events = [*(op(k) for k in range(n)), done]
    assert operator_position(elf, events) == f"after execute() call 1 ended (all {n} operators)"
    assert operator_position(elf, [*events, op(0)]).startswith(
        f"in execute() call 2, after operator 1 of {n} ({names[0]})"
    )
