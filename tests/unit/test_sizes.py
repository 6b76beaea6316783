"""Size report and footprint: component attribution from a linker map (archives, objects,
LTO partitions, long section names, fill), the RAM blocks, the table and the SVG chart, and
the totals of a small linked ELF against binutils (tests/integration/test_sizes_on_firmware.py
builds real firmware and checks it the same way)."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from deploykit.readers.footprint import footprint
from deploykit.readers.sizes import component_of, size_report
from tests.markers import requires_toolchain

RT = "/ws/runtime-cache/et1.4.1-cortex-m55-0123/lib"
SP = " "  # ld ends a *fill* line with a space
REG = "runner/CMakeFiles/dk_et_operator_registry.dir/ws/executorch/runtime/kernel"
OPS = "runner/libdk_model_ops.a"

MAP = f"""\
Archive member included to satisfy reference by file (symbol)

Memory Configuration

Name             Origin             Length             Attributes
itcm             0x10000000         0x00080000         xrw

Linker script and memory map

.vectors        0x10000000      0x1c0
 .vectors       0x10000000      0x1c0 boards/libdk_board.a(vectors.c.obj)

.text           0x11000000     0x1000
 .text._ZN10executorch7runtime6Method4initEv
                0x11000000      0x300 {RT}/libexecutorch_core.a(method.cpp.obj)
 .text.arm_convolve_s8
                0x11000300      0x200 {RT}/libcmsis-nn.a(arm_convolve_s8.c.obj)
 .text._ZN8cortex_m6native20quantized_conv2d_outE
                0x11000500      0x100 {RT}/libcortex_m_kernels.a(op_quantized_conv2d.cpp.obj)
 .text          0x11000600       0x80 /usr/lib/arm-none-eabi/lib/thumb/libc_nano.a(lib_a-memcpy.o)
 *fill*         0x11000680        0x4{SP}
 .text.main     0x11000684       0x7c runner/CMakeFiles/dk_runner.dir/runner.cpp.obj
 .text._ZN5torch8executor6native7add_outE
                0x11000700      0x100 /tmp/ccAB.ltrans0.ltrans.o
 .text.startup.main
                0x11000800      0x200 /tmp/ccAB.ltrans0.ltrans.o
 .text          0x11000a00      0x100 {RT}/libdk_portable_op_add.a(op_add.cpp.obj)
 .text          0x11000b00      0x100 {REG}/operator_registry.cpp.obj
 .text          0x11000c00      0x400 {OPS}(RegisterCodegenUnboxedKernelsEverything.cpp.obj)

.dk_model       0x70000000      0x100
 .dk_model      0x70000000      0x100 runner/CMakeFiles/dk_runner.dir/gen/model_pte.c.obj

.stack          0x30000000      0x800

.data           0x30000800       0x10 load address 0x11001000
 .data.dk_x     0x30000800       0x10 boards/libdk_board.a(board.c.obj)

.bss            0x30000810       0x20
 .bss._ZN12_GLOBAL__N_116method_allocatorE
                0x30000810       0x20 runner/CMakeFiles/dk_runner.dir/runner.cpp.obj

.heap           0x30000830      0x100

.dk_pools       0x31000000      0x900
 .dk_pools      0x31000000      0x900 runner/CMakeFiles/dk_runner.dir/runner.cpp.obj

.ARM.attributes
                0x00000000       0x3c
 .ARM.attributes
                0x00000000       0x3e runner/CMakeFiles/dk_runner.dir/runner.cpp.obj
 .ARM.attributes
                0x0000003e       0x3e {RT}/libexecutorch_core.a(method.cpp.obj)

.debug_info     0x00000000      0x500
 .debug_info    0x00000000      0x500 /usr/lib/libc_nano.a(lib_a-memcpy.o)
"""


def test_component_of():
    assert component_of(f"{RT}/libcortex_m_kernels.a(op.cpp.obj)", ".text") == \
        "cortex_m kernels"  # not the C library, although its name starts with "libc"
    assert component_of(f"{RT}/libcmsis-nn.a(x.c.obj)", ".text") == "CMSIS-NN"
    assert component_of(f"{RT}/libdk_portable_op_addmm.a(op_addmm.cpp.obj)", ".text") == \
        "portable op addmm"
    assert component_of("/usr/lib/libstdc++_nano.a(del_op.o)", ".text") == "C/C++ library"
    assert component_of("/tmp/cc1.ltrans0.ltrans.o", ".text._ZNK10executorch7runtime6EValue"
                        "8toStringEv") == "runtime core"
    assert component_of("/tmp/cc1.ltrans0.ltrans.o", ".rodata._ZTVN10executorch9extension"
                        "16BufferDataLoaderE") == "runtime core"
    assert component_of("/tmp/cc1.ltrans1.ltrans.o", ".text.arm_nn_vec_mat_mult_t_s8") == \
        "CMSIS-NN"
    assert component_of("/tmp/cc1.ltrans1.ltrans.o", ".text.startup._sub_I_65535_0.0") == \
        "kernel registration"
    assert component_of("/tmp/cc1.ltrans1.ltrans.o", ".text.snprintf.constprop.0") == \
        "C/C++ library"
    assert component_of("x/CMakeFiles/dk_runner.dir/w/firmware/boards/rp2350/board.c.obj",
                        ".text") == "board + protocol"
    assert component_of("x/CMakeFiles/dk_runner.dir/w/pico-sdk/src/rp2_common/irq.c.obj",
                        ".text") == "pico-sdk"


def test_npu_components():
    """Arm's Ethos-U driver and ExecuTorch's EthosUBackend, by archive and, with LTO, by
    symbol; the runner's NPU glue is runner; the NPU blocks are pools / the fast arena."""
    assert component_of(f"{RT}/libethosu_core_driver.a(ethosu_driver.c.obj)", ".text") == \
        "NPU driver"
    assert component_of(f"{RT}/libexecutorch_delegate_ethos_u.a(EthosUBackend.cpp.obj)",
                        ".text") == "Ethos-U backend"
    lto = "/tmp/cc1.ltrans0.ltrans.o"
    for section, comp in (
            (".text.ethosu_wait", "NPU driver"),
            (".rodata.ethosu_wait.str1.1", "NPU driver"),
            (".text.ETHOSU_PMU_Get_CCNTR", "NPU driver"),
            (".text._ZNK10executorch8backends3arm13EthosUBackend7executeERNS_7runtime23Backend"
             "ExecutionContextEPvNS3_4SpanIPNS3_6EValueEEE", "Ethos-U backend"),
            (".text.executorch_delegate_EthosUBackend_registered", "Ethos-U backend"),
            (".text.arm_ethos_io_memcpy", "Ethos-U backend"),
            (".text.arm_nn_vec_mat_mult_t_s8", "CMSIS-NN"),
            (".text.dk_npu_init", "runner"),
            (".text.dk_send_npu", "board + protocol"),
            (".dk_npu_scratch", "pools"),
            (".dk_npu_fast", "Ethos-U fast arena")):
        assert component_of(lto, section) == comp, section


def test_footprint_of_an_npu_image():
    """The temp pool and the Vela scratch are one block, peak = both peaks; the fast arena's
    peak is its size."""
    from deploykit.readers.sizes import SizeReport

    sizes = SizeReport(flash_by_component={"NPU driver": 2000, "runner": 500},
                       ram_by_component={"method pool": 2048, "temp pool + Ethos-U scratch":
                                         1_510_400, "Ethos-U fast arena": 393_216,
                                         "planned buffers": 752_640, "runner": 300},
                       stack=4096, heap=0)
    fp = footprint(sizes, "npu", {"method_pool": 1900, "temp_pool": 200, "planned_pool":
                                  752_640, "npu_scratch": 1_510_224, "stack": 3000, "heap": 0})
    blocks = {b.name: (b.size, b.peak) for b in fp.ram}
    assert "temp pool" not in blocks
    assert blocks["temp pool + Ethos-U scratch"] == (1_510_400, 1_510_424)
    assert blocks["Ethos-U fast arena"] == (393_216, 393_216)
    assert fp.to_json()["flash"]["NPU driver"] == 2000
    # before a run the scratch's peak is unknown unless the caller gives Vela's
    fp = footprint(sizes, "npu", {"temp_pool": 200})
    assert {b.name: b.peak for b in fp.ram}["temp pool + Ethos-U scratch"] is None


def test_map_without_elf(tmp_path):
    path = tmp_path / "dk_runner.map"
    path.write_text(MAP)
    r = size_report(path)
    f = r.flash_by_component
    assert f["runtime core"] == 0x300 and f["CMSIS-NN"] == 0x200
    assert f["cortex_m kernels"] == 0x100 and f["C/C++ library"] == 0x80
    assert f["runner"] == 0x7c + 0x200  # runner.cpp and LTO's main
    assert f["portable kernels"] == 0x100 and f["portable op add"] == 0x100
    assert f["kernel registry"] == 0x100 and f["kernel registration"] == 0x400
    assert f["model data"] == 0x100 and f["alignment"] == 4
    assert f["board + protocol"] == 0x1c0 + 0x10  # vectors, and .data's load image
    assert r.lto
    # RAM: .data/.bss by component; stack, heap and pools as blocks; no .ARM.attributes or
    # debug sections (they follow NOLOAD sections in the map, with no address of their own)
    assert r.ram_by_component == {"board + protocol": 0x10, "runner": 0x20, "stack": 0x800,
                                  "heap": 0x100, "pools": 0x900}
    assert r.static_data == 0x30
    assert r.sections[".ARM.attributes"] == 0x3c


def test_footprint_table_and_svg(tmp_path):
    path = tmp_path / "dk_runner.map"
    path.write_text(MAP)
    peaks = {"method_pool": 1000, "temp_pool": 100, "planned_pool": 700, "stack": 1500,
             "heap": 0}
    fp = footprint(size_report(path), "footprint: m on b", peaks, "measured")
    names = [b.name for b in fp.ram]
    assert names[-1] == ".data/.bss" and "stack" in names and "pools" in names
    text = fp.table()
    assert "runtime core" in text and "stack" in text and "peaks: measured" in text
    assert "LTO build" in text
    svg = fp.svg()
    root = ET.fromstring(svg)  # well-formed
    assert root.tag.endswith("svg")
    assert fp.svg() == svg  # deterministic
    assert "runtime core" in svg and "peak 1,500" in svg
    svg_path, json_path = fp.write(tmp_path)
    assert svg_path.read_text() == svg and '"flash_total"' in json_path.read_text()


def _objdump_totals(elf: Path) -> tuple[int, int]:
    """(flash, RAM) of an ELF by binutils' own reading of its sections: flash is every
    allocated section with contents, RAM every allocated one that has none or that runs at
    another address (VMA) than it loads at (LMA)."""
    out = subprocess.run(["arm-none-eabi-objdump", "-h", str(elf)], capture_output=True,
                         text=True, check=True).stdout
    flash = ram = 0
    rows = re.findall(r"^\s*\d+ (\S+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)\s+\S+\s+\S+\n"
                      r"\s+(.*)$", out, re.MULTILINE)
    for _name, size, vma, lma, flags in rows:
        if "ALLOC" not in flags:
            continue
        contents = "CONTENTS" in flags and "LOAD" in flags
        flash += int(size, 16) if contents else 0
        ram += int(size, 16) if not contents or vma != lma else 0
    return flash, ram


@requires_toolchain
def test_ram_is_what_runs_in_ram(tmp_path):
    """A writable section that stays where it loads (.init_array in flash, as the pico-sdk
    links it) is flash, not RAM; .data (copied) is both; .bss is RAM."""
    (tmp_path / "t.c").write_text(
        "int counter = 7;\nint zeroed[16];\n"
        "__attribute__((constructor)) static void start(void) { counter++; }\n"
        "void _start(void) { zeroed[counter] = counter; for (;;) {} }\n")
    (tmp_path / "t.ld").write_text(
        "MEMORY { FLASH (rx) : ORIGIN = 0x10000000, LENGTH = 64K\n"
        "         RAM (rwx) : ORIGIN = 0x20000000, LENGTH = 16K }\n"
        "SECTIONS {\n"
        "  .text : { *(.text*) *(.rodata*) } > FLASH\n"
        "  .init_array : { KEEP(*(.init_array*)) } > FLASH\n"
        "  .data : { *(.data*) } > RAM AT> FLASH\n"
        "  .bss (NOLOAD) : { *(.bss*) *(COMMON) } > RAM\n"
        "}\n")
    elf = tmp_path / "dk_runner.elf"
    subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m33", "-mthumb", "-O1", "-nostdlib",
                    "-T", str(tmp_path / "t.ld"), f"-Wl,-Map={elf.with_suffix('.map')}",
                    "-o", str(elf), str(tmp_path / "t.c")], check=True)
    r = size_report(elf.with_suffix(".map"), elf)
    assert r.sections[".init_array"] == 4
    assert (r.flash_total, r.ram_total) == _objdump_totals(elf)
    assert r.ram_total == 4 + 64  # counter, zeroed: not the constructor table
