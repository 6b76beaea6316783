"""Flows and board families from another installed package (entry points), as a user adds
them: a package on the path with its dist-info, in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
from deploykit.families.mps import MpsFamily
from deploykit.flows.portable_fp32 import PortableFp32


class ExtraFlow(PortableFp32):
    name = "extra_fp32"
    summary = "a flow from another package"


class ExtraFamily(MpsFamily):
    name = "extra_mps"
    summary = "a board family from another package"
'''


def _install(site: Path, entry_points: str) -> None:
    """What pip leaves in site-packages for a package: the module and its dist-info."""
    (site / "dk_extra.py").write_text(PLUGIN)
    info = site / "dk_extra-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dk-extra\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def _run(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "tools"),
                                          os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    _install(tmp_path, """
        [deploykit.flows]
        extra_fp32 = dk_extra:ExtraFlow

        [deploykit.families]
        extra_mps = dk_extra:ExtraFamily
    """)
    return tmp_path


def test_an_installed_flow_is_offered_by_the_cli(site):
    r = _run(site, "-m", "deploykit.cli", "export", "--help")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "extra_fp32" in flat and "a flow from another package" in flat
    assert "portable_fp32" in flat  # the built-in ones stay


def test_installed_flow_and_family_are_usable_by_board_and_model_files(site, tmp_path):
    board = (REPO / "boards" / "qemu-an547.yaml").read_text()
    board = board.replace("family: mps", "family: extra_mps").replace(
        "allowed: [portable_fp32, cortex_m_int8]", "allowed: [portable_fp32, extra_fp32]")
    (tmp_path / "b").mkdir()
    board_file = tmp_path / "b" / "qemu-an547.yaml"
    board_file.write_text(board)
    model = tmp_path / "m.py"
    model.write_text("import torch\nTOLERANCE = {'extra_fp32': {'atol': 0.5}}\n"
                     "def model():\n    return torch.nn.ReLU()\n"
                     "def example_inputs():\n    return (torch.ones(2),)\n")
    code = textwrap.dedent(f"""
        from deploykit.api import target
        from deploykit.program.models import load_model
        t = target({str(board_file)!r}, flow="extra_fp32")
        print(t.family.name, t.flow.name)
        print(load_model({str(model)!r}, {str(REPO)!r}).tolerance_for("extra_fp32"))
    """)
    r = _run(site, "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["extra_mps extra_fp32", "{'atol': 0.5}"]


def test_a_broken_extension_is_a_clear_error_not_a_traceback(tmp_path):
    _install(tmp_path, """
        [deploykit.flows]
        broken = dk_missing_module:Flow
    """)
    r = _run(tmp_path, "-m", "deploykit.cli", "export", "--help")
    assert r.returncode == 3
    assert "Traceback" not in r.stderr
    assert "flow 'broken' of dk-extra" in r.stderr and "dk_missing_module" in r.stderr
