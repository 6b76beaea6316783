"""The Ethos-U NPU firmware (ethos_u_int8 on corstone-300/320), built for real from the
workspace's Ethos-U core driver and CMSIS_6, and run where it can run here.

There is no FVP and no Corstone board on this machine, so the NPU itself never runs. What is
checked instead:

- QEMU's mps3-an547 has Corstone-300's memory map and UART but no NPU: the corstone-300 NPU
  ELF runs there (the board file with its FVP runner swapped for QEMU) and must end with the
  "no Ethos-U" error record (code 0x1007), done status 1 and the device-error exit class, never
  a hang or a success. A board whose NPU address is unmapped there gets the bus-fault variant of
  the message; the same program without EthosUBackend linked gets the missing-backend record.
- The three ELFs of the issue (corstone-320 mobilenet_v2_lrn, corstone-320 mobilenet_v2 in
  Dedicated_Sram_384KB, corstone-300 mobilenet_v2), checked from their symbols: the backend's
  registration is linked, the NPU's vector slot holds the NPU IRQ handler, the model, the
  scratch (the temp pool) and the fast arena lie in the regions their memory mode requires, and
  the footprint has an "NPU driver" component. MobileNetV2 exports take ~40-60 s each: `slow`.
- corstone-300's CPU-only flow (cortex_m_int8) still runs on QEMU and matches the host.

Without the driver sources (CI) everything here skips and says which sources are missing.
"""

from __future__ import annotations

import struct
from pathlib import Path

import ethosu.vela  # noqa: F401
import executorch  # noqa: F401  (a hard dependency: a broken install fails here)
import pytest
import yaml

from deploykit import api
from deploykit.readers.boards import load_board
from deploykit.util.errors import ExitCode
from tests.markers import (
    requires_cmake,
    requires_ethos_u_sources,
    requires_qemu,
    requires_sources,
    requires_toolchain,
)

REPO = Path(__file__).resolve().parents[2]
ERR_NO_BACKEND, ERR_NO_NPU = 0x1006, 0x1007
QEMU_AN547 = {"kind": "qemu", "machine": "mps3-an547", "cpu": "cortex-m55"}

def _board_file(directory: Path, name: str = "corstone-300", runner: dict | None = None,
                **npu: object) -> Path:
    """A copy of a board file (same name, so that it is that board) with another runner or NPU
    fields: corstone-300 on QEMU's mps3-an547, or with its NPU at another address."""
    data = yaml.safe_load((REPO / "boards" / f"{name}.yaml").read_text())
    if runner is not None:
        data["runner"] = runner
    data["npu"].update(npu)
    path = directory / f"{data['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def no_npu_run(tmp_path_factory):
    """tiny_cnn through ethos_u_int8 for corstone-300, built and run on QEMU mps3-an547."""
    base = tmp_path_factory.mktemp("c300-on-an547")
    board = _board_file(base / "board", runner=QEMU_AN547)
    out = base / "out"
    report = api.run(str(board), "tiny_cnn", out=out, timeout=60)
    return report, out


@requires_qemu
@requires_toolchain
@requires_cmake
@requires_sources
@requires_ethos_u_sources
def test_npu_firmware_without_an_npu_says_so(no_npu_run):
    report, _ = no_npu_run
    records = report.records
    print("\n".join(f"{type(r).__name__}: {r}" for r in records.records))
    assert report.exit_code == ExitCode.DEVICE_ERROR and not report.passed
    (error,) = records.errors
    assert error.code == ERR_NO_NPU
    assert error.message == ("no Ethos-U at 0x58102000: ID register read 0x00000000, an "
                             "Ethos-U55 reads architecture 1.x (ethos-u55-128, board file "
                             "npu.base)")
    assert records.done is not None and records.done.status == 1
    assert not records.tensors and records.fault is None
    assert records.hello.fields["npu"] == "ethos-u55-128"
    assert records.hello.fields["backends"] == "EthosUBackend"
    assert "no Ethos-U at 0x58102000" in report.cause


@requires_qemu
@requires_toolchain
@requires_cmake
@requires_sources
@requires_ethos_u_sources
def test_an_npu_address_that_faults_is_reported_not_fatal(tmp_path):
    """0x50004000 (Corstone-320's NPU) is unmapped on mps3-an547: the ID register read raises
    a bus fault, which the probe absorbs and reports."""
    board = _board_file(tmp_path / "board", runner=QEMU_AN547, base=0x50004000)
    report = api.run(str(board), "tiny_cnn", out=tmp_path / "out", timeout=60)
    assert report.exit_code == ExitCode.DEVICE_ERROR
    (error,) = report.records.errors
    assert (error.code, error.message) == (
        ERR_NO_NPU, "no Ethos-U at 0x50004000: ID register read raised a bus fault (nothing "
                    "answers there)")
    assert report.records.fault is None


@requires_qemu
@requires_toolchain
@requires_cmake
@requires_sources
@requires_ethos_u_sources
def test_a_delegate_without_its_backend_is_a_clear_record(no_npu_run, tmp_path):
    """The same program and generated files, linked without EthosUBackend (DK_ETHOS_U=OFF)."""
    from deploykit.families import family_of
    from deploykit.run.runners import QemuRunner

    _, out = no_npu_run
    cache = (out / "firmware" / "CMakeCache.txt").read_text().splitlines()
    defs = {}
    for line in cache:
        key, sep, value = line.partition("=")
        name = key.split(":")[0]
        if sep and (name.startswith("DK_") or name == "EXECUTORCH_SOURCE_DIR"):
            defs[name] = value
    defs["DK_ETHOS_U"] = "OFF"
    board = load_board("corstone-300")
    fw = family_of(board).build_image(board, out / "generated", tmp_path / "fw", "runner", defs)
    result = QemuRunner(QEMU_AN547).run(fw.elf, tmp_path, timeout_s=60, check=False)
    records = result.records
    assert records.hello.fields["backends"] == ""
    (error,) = records.errors
    assert error.code == ERR_NO_BACKEND
    assert error.message.startswith("the program delegates to EthosUBackend, which this "
                                    "firmware does not register (it has none)")
    assert records.done.status == 1
    assert result.outcome().exit_code == ExitCode.DEVICE_ERROR


@requires_qemu
@requires_toolchain
@requires_cmake
@requires_sources
def test_corstone_300_cpu_flow_still_runs_on_qemu_with_parity(tmp_path):
    board = _board_file(tmp_path / "board", runner=QEMU_AN547)
    report = api.run(str(board), "tiny_cnn", flow="cortex_m_int8", out=tmp_path / "out",
                     timeout=60)
    assert report.passed, report.summary()
    assert report.records.hello.fields.get("backends", "") == ""
    assert "npu" not in report.records.hello.fields


# ---- the three ELFs of the issue, checked from their symbols --------------------------------

ELF_CASES = [
    ("corstone-320", "mobilenet_v2_lrn", None),
    ("corstone-320", "mobilenet_v2", "Dedicated_Sram_384KB"),
    ("corstone-300", "mobilenet_v2", None),
]


def _symbols(elf):
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        e = ELFFile(f)
        syms = {}
        for s in e.get_section_by_name(".symtab").iter_symbols():
            syms.setdefault(s.name, s.entry)
        sections = {s.name: (s["sh_addr"], s["sh_size"], s.data() if s.name in (
            ".vectors", ".init_array") else None) for s in e.iter_sections()}
    return syms, sections


def _symbol(syms, part):
    (name,) = [n for n in syms if part in n and syms[n]["st_info"]["type"] == "STT_OBJECT"]
    return syms[name]


def _region(board, addr, size=1):
    return next(r.name for r in board.memory if r.origin <= addr and addr + size <= r.end)


@pytest.mark.slow
@pytest.mark.parametrize("case", ELF_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2] or 'default'}")
@requires_toolchain
@requires_cmake
@requires_sources
@requires_ethos_u_sources
def test_npu_elf_links_the_backend_the_irq_and_the_memory_mode(case, tmp_path):
    board_name, model, mode = case
    built = api.build(board_name, model, out=tmp_path, npu_memory_mode=mode)
    board = api.target(board_name, npu_memory_mode=mode).board
    npu = board.npu
    layout = npu.layout
    plan = built.planned.plan
    syms, sections = _symbols(built.firmware.elf)

    # EthosUBackend's static registration is linked and runs at start-up.
    assert syms["executorch_delegate_EthosUBackend_registered"]["st_info"]["type"] == "STT_FUNC"
    _symbol(syms, "EthosUBackend_registered")  # the registration's result, a static object
    assert sections[".init_array"][1] >= 4

    # The NPU's vector slot holds the firmware's NPU IRQ handler (a strong symbol), no other
    # slot does.
    vectors = sections[".vectors"][2]
    slots = struct.unpack_from(f"<{len(vectors) // 4}I", vectors)
    handler = syms["dk_npu_irq_handler"]
    assert handler["st_info"]["bind"] == "STB_GLOBAL"
    assert slots[16 + npu.irq] == handler["st_value"] | 1
    assert slots.count(handler["st_value"] | 1) == 1

    # Placement: the model, the scratch (the temp pool EthosUBackend takes it from) and the
    # fast arena where the memory mode needs them (the board's npu.axi map).
    model_sym = syms["dk_model_pte"]
    assert _region(board, model_sym["st_value"]) == npu.region_of(layout.model)
    temp = _symbol(syms, "temp_pool")
    assert _region(board, temp["st_value"], temp["st_size"]) == npu.region_of(layout.scratch)
    scratch = next(i for i in plan.items if i.name.startswith("Ethos-U scratch"))
    assert temp["st_size"] == plan.temp_pool + scratch.size
    fast_start, fast_size, _ = sections[".dk_npu_fast"]
    assert fast_size == layout.fast_scratch
    if layout.fast_scratch:
        arena = _symbol(syms, "fast_arena")
        assert arena["st_size"] == layout.fast_scratch
        assert _region(board, arena["st_value"], arena["st_size"]) == npu.sram_region
    print(f"{board_name} {model} {layout.mode}: model 0x{model_sym['st_value']:08X} "
          f"({_region(board, model_sym['st_value'])}), scratch+temp 0x{temp['st_value']:08X} "
          f"{temp['st_size']:,} B ({_region(board, temp['st_value'])}), fast arena "
          f"0x{fast_start:08X} {fast_size:,} B")

    # The footprint names the driver and the backend.
    flash = built.footprint.to_json()["flash"]
    assert flash["NPU driver"] > 0 and flash["Ethos-U backend"] > 0
    assert built.firmware.sizes.flash_by_component["NPU driver"] == flash["NPU driver"]
