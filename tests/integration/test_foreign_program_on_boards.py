"""Programs deploykit did not make, as the model, built and run with sources (issue #27).

- Written with ExecuTorch's Python API alone (tests/foreign_programs.py): the portable one (no
  partitioner) and the Cortex-M quantizer's run on QEMU's Cortex-M55 and match their host run.
- Made by ExecuTorch's own examples/arm/aot_arm_compiler.py from the workspace's source tree:
  the Cortex-M55 one runs on QEMU and matches its host run; the Ethos-U85-256 one is built for
  corstone-320 (no FVP here) and checked from its symbols: EthosUBackend registered, the NPU
  IRQ in its vector slot, the program's own bytes as the embedded model, the model and the
  scratch where its memory mode (the script's default for the U85, Sram_Only) puts them, and
  the FVP configured with the program's MAC count. On corstone-300 (an Ethos-U55) it is refused
  before anything is built.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit import api
from deploykit.readers.sources import load_workspace
from deploykit.util.errors import ConfigError
from tests import foreign_programs
from tests.markers import requires_cmake, requires_qemu, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_sources]

# The model aot_arm_compiler.py compiles: a file defining ModelUnderTest and ModelInputs.
AOT_MODEL = '''
import torch
from torch import nn


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = self.pool(torch.relu(self.conv2(x)))
        return self.fc(torch.flatten(self.gap(x), 1))


torch.manual_seed(0)
ModelUnderTest = SmallCnn().eval()
ModelInputs = (torch.rand(1, 3, 16, 16) * 2 - 1,)
'''


@pytest.fixture(scope="module")
def python_api_programs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("python-api")
    return {make.__name__: make(out / f"{make.__name__}.pte")
            for make in (foreign_programs.portable, foreign_programs.cortex_m)}


def _aot_arm_compiler(out: Path, target: str, *extra: str) -> Path:
    """examples/arm/aot_arm_compiler.py of the workspace's ExecuTorch, run as its README says,
    with the pip executorch."""
    script = load_workspace().executorch_dir / "examples" / "arm" / "aot_arm_compiler.py"
    model = out / "small_cnn.py"
    model.write_text(AOT_MODEL)
    pte = out / f"{target}.pte"
    res = subprocess.run([sys.executable, str(script), f"--model_name={model}",
                          f"--target={target}", "--quantize", *extra, f"--output={pte}"],
                         cwd=out, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0 and pte.is_file(), res.stdout[-2000:] + res.stderr[-3000:]
    return pte


@pytest.fixture(scope="module")
def aot_cortex_m55(tmp_path_factory) -> Path:
    return _aot_arm_compiler(tmp_path_factory.mktemp("aot-cm55"), "cortex-m55")


@pytest.fixture(scope="module")
def aot_ethos_u85(tmp_path_factory) -> Path:
    return _aot_arm_compiler(tmp_path_factory.mktemp("aot-u85"), "ethos-u85-256", "--delegate")


def _runs_and_matches(program: Path, out: Path, kind_starts: str) -> None:
    report = api.run("qemu-an547", str(program), out=out, timeout=120, project=False)
    print(report.summary())
    assert report.passed, report.summary()
    assert report.reference_kind.startswith(kind_starts)
    assert report.verdict is not None and report.verdict.passed
    for output in report.verdict.outputs:
        assert output.max_abs_error <= output.tolerance.atol and output.top1_agrees


@requires_qemu
def test_the_python_api_programs_run_on_qemu_and_match_their_host_run(python_api_programs,
                                                                      tmp_path):
    _runs_and_matches(python_api_programs["portable"], tmp_path / "portable",
                      "executorch-pybindings")
    _runs_and_matches(python_api_programs["cortex_m"], tmp_path / "cortex_m",
                      "host run of the program's operators")


@requires_qemu
def test_the_aot_arm_compiler_cortex_m_program_runs_on_qemu(aot_cortex_m55, tmp_path):
    assert api.command("qemu-an547", str(aot_cortex_m55), project=False).target.flow.name == \
        "cortex_m_int8"
    _runs_and_matches(aot_cortex_m55, tmp_path / "cm55", "host run of the program's operators")


def _symbols(elf: Path):
    from elftools.elf.elffile import ELFFile

    with open(elf, "rb") as f:
        e = ELFFile(f)
        symbols = {s.name: s.entry for s in e.get_section_by_name(".symtab").iter_symbols()}
        sections = [(s["sh_addr"], s["sh_size"], s.data()) for s in e.iter_sections()
                    if s["sh_type"] == "SHT_PROGBITS"]
        vectors = e.get_section_by_name(".vectors").data()
    return symbols, sections, vectors


def _read(sections, address: int, size: int) -> bytes:
    for start, length, data in sections:
        if start <= address and address + size <= start + length:
            return data[address - start:address - start + size]
    raise AssertionError(f"0x{address:08X} is in no loaded section")


def test_the_aot_arm_compiler_ethos_u85_program_builds_for_corstone_320(aot_ethos_u85,
                                                                        tmp_path):
    with pytest.raises(ConfigError, match="corstone-300 has an ethos-u55-128 NPU"):
        api.build("corstone-300", str(aot_ethos_u85), out=tmp_path / "u55", project=False)
    assert not (tmp_path / "u55").exists()  # refused before anything was made

    built = api.build("corstone-320", str(aot_ethos_u85), out=tmp_path / "u85", project=False)
    target = api.command("corstone-320", str(aot_ethos_u85), project=False).target
    npu, program = target.npu, target.program
    assert (target.flow.name, npu.target) == ("ethos_u_int8", "ethos-u85-256")
    assert program.npu_memory_mode == npu.memory_mode == "Sram_Only"  # the script's default
    symbols, sections, vectors = _symbols(built.firmware.elf)
    assert symbols["executorch_delegate_EthosUBackend_registered"]["st_info"]["type"] == \
        "STT_FUNC"
    slots = struct.unpack_from(f"<{len(vectors) // 4}I", vectors)
    assert slots[16 + npu.irq] == symbols["dk_npu_irq_handler"]["st_value"] | 1
    # The embedded model is the program, byte for byte.
    data = aot_ethos_u85.read_bytes()
    model = symbols["dk_model_pte"]
    assert _read(sections, model["st_value"], len(data)) == data

    def region(address: int) -> str:
        return next(r.name for r in target.board.memory if r.origin <= address < r.end)

    layout = npu.layout
    assert region(model["st_value"]) == npu.region_of(layout.model) == "sram"
    temp = next(s for n, s in symbols.items() if "temp_pool" in n
                and s["st_info"]["type"] == "STT_OBJECT")
    assert region(temp["st_value"]) == npu.region_of(layout.scratch)
    scratch = program.info.max_scratch
    assert scratch and temp["st_size"] >= scratch  # the Vela scratch the program needs
    # The FVP would run it with the program's MAC count.
    command = target.make_runner(None, lambda _m: None).command(built.firmware.elf,
                                                                 console_file=tmp_path / "c")
    assert any(arg.endswith(".num_macs=256") for arg in command)
    flash = built.footprint.to_json()["flash"]
    assert flash["NPU driver"] > 0 and flash["Ethos-U backend"] > 0
