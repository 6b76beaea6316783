"""Build profiles, verified on the built objects (docs/profiles.md): the float ABI in the ELF's
attributes, position-independent relocations in the runtime libraries, logging symbols, LTO,
the kernel registry size. Builds mlp_mnist int8 for qemu-an505 in `reference` and `size`
(the runtime libraries come from the workspace's cache once built)."""

import re
import subprocess
from pathlib import Path

import pytest

from deploykit import api
from tests.markers import requires_cmake, requires_sources, requires_toolchain

pytestmark = [requires_toolchain, requires_cmake, requires_sources]

LOG_SYMBOLS = ("executorch::runtime::internal::vlogf", "et_pal_emit_log_message")
PIC_RELOCATIONS = re.compile(r"\bR_ARM_(GOT_BREL|GOT_PREL|GOTOFF32|GOT32)\b")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    return {p: api.build("qemu-an505", "mlp_mnist", flow="cortex_m_int8", out=out / p,
                         profile=p)
            for p in ("reference", "size")}


def _run(*cmd) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=True).stdout


def _runtime_archive(map_file: Path, name: str) -> Path:
    m = re.search(rf"(/\S+/lib/{re.escape(name)})\(", map_file.read_text())
    assert m, f"{name} is not in {map_file}"
    return Path(m.group(1))


def test_float_abi(builds):
    ref = _run("arm-none-eabi-readelf", "-A", str(builds["reference"].firmware.elf))
    size = _run("arm-none-eabi-readelf", "-A", str(builds["size"].firmware.elf))
    # reference: soft float, no FPU instructions; size: the board's hard-float ABI with the FPU.
    assert "Tag_ABI_VFP_args: VFP registers" not in ref and "Tag_FP_arch" not in ref
    assert "Tag_ABI_VFP_args: VFP registers" in size and "Tag_FP_arch" in size


def test_pic_relocations_only_in_the_reference_runtime(builds):
    for profile, expect_pic in (("reference", True), ("size", False)):
        fw = builds[profile].firmware
        core = _runtime_archive(fw.map_file, "libexecutorch_core.a")
        relocs = _run("arm-none-eabi-objdump", "-r", str(core))
        assert bool(PIC_RELOCATIONS.search(relocs)) == expect_pic, (profile, core)


def test_logging_symbols(builds):
    ref = _run("arm-none-eabi-nm", "-C", str(builds["reference"].firmware.elf))
    size = _run("arm-none-eabi-nm", "-C", str(builds["size"].firmware.elf))
    for symbol in LOG_SYMBOLS:
        assert symbol in ref, symbol
        assert symbol not in size, symbol


def test_lto_registry_and_libc(builds):
    ref_map = builds["reference"].firmware.map_file.read_text()
    size_map = builds["size"].firmware.map_file.read_text()
    assert ".ltrans" in size_map and ".ltrans" not in ref_map
    ref_log = builds["reference"].firmware.log.read_text()
    size_log = builds["size"].firmware.log.read_text()
    assert "MAX_KERNEL_NUM=2000 (profile reference)" in ref_log
    # The int8 MLP: 3 cortex_m kernels, no primitive operator.
    assert "MAX_KERNEL_NUM=3 (profile size)" in size_log
    nm = _run("arm-none-eabi-nm", str(builds["size"].firmware.elf))
    assert "_svfprintf_r" not in nm and "_malloc_r" not in nm
