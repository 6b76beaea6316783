"""deploykit installs like a tool: a wheel built from this checkout, installed into a fresh
virtual environment outside it, runs from a directory of its own, with the boards, models,
firmware and CMake files it carries (paths.data_root).

The environment borrows the running Python's packages (torch, executorch, ...) through a .pth
file instead of installing 2 GB again; only the deploykit wheel is installed into it, so
nothing of the checkout is on its path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from deploykit.util.paths import DATA_ITEMS, checkout_root
from tests.markers import requires_cmake, requires_qemu, requires_toolchain

pytestmark = pytest.mark.slow

BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "tools", *DATA_ITEMS)


def _run(cmd, cwd, env, timeout=600):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    """(the venv's deploykit, a fresh working directory, the environment to run it in)."""
    root = checkout_root()
    if root is None:
        pytest.skip("deploykit is installed, not run from a checkout: no sources to build a "
                    "wheel from")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    for item in BUILD_INPUTS:  # build from a copy: the checkout gets no build/ or egg-info
        if (root / item).is_dir():
            shutil.copytree(root / item, src / item,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(root / item, src / item)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DEPLOYKIT_WORKSPACE",
                        "DEPLOYKIT_BOARDS_DIR", "DEPLOYKIT_MODELS_DIR")}
    env["XDG_STATE_HOME"] = str(base / "state")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                  base / "dist", src], cwd=base, env=env)
    if built.returncode != 0:
        pytest.skip("cannot build the wheel here (pip wheel needs setuptools>=68 from the "
                    f"package index): {built.stderr.strip()[-400:]}")
    wheel = next((base / "dist").glob("deploykit-*.whl"))
    venv = base / "venv"
    made = _run([sys.executable, "-m", "venv", venv], cwd=base, env=env)
    assert made.returncode == 0, made.stderr
    vpy = venv / "bin" / "python"
    site = _run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                cwd=base, env=env).stdout.strip()
    # The running interpreter's packages, after the venv's own (a .pth line is appended to
    # sys.path; the .pth files in that directory, such as an editable deploykit, are not run).
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "_parent_packages.pth").write_text("\n".join(parents) + "\n")
    installed = _run([vpy, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                     cwd=base, env=env)
    assert installed.returncode == 0, installed.stderr
    work = base / "project"
    work.mkdir()
    return venv / "bin" / "deploykit", work, env


def test_the_wheel_carries_the_data_and_runs_outside_the_checkout(tool):
    deploykit, work, env = tool
    res = _run([deploykit, "boards", "--json"], cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    boards = {b["name"]: b for b in json.loads(res.stdout)}
    assert {"qemu-an547", "qemu-an505", "pico2"} <= set(boards)
    assert boards["qemu-an547"]["origin"] == "bundled"
    path = Path(boards["qemu-an547"]["path"])
    assert "site-packages" in path.parts and path.parent.parent.name == "data"
    data = path.parent.parent
    for item in DATA_ITEMS:
        assert (data / item).exists(), item
    assert (data / "firmware" / "CMakeLists.txt").is_file()
    assert (data / "cmake" / "arm-none-eabi-gcc.cmake").is_file()
    assert checkout_root() not in path.parents


def test_python_dash_m_from_the_wheel(tool):
    deploykit, work, env = tool
    res = _run([deploykit.parent / "python", "-m", "deploykit", "profiles"], cwd=work, env=env)
    assert res.returncode == 0 and "speed" in res.stdout, res.stderr


def test_export_and_plan_from_the_wheel(tool):
    deploykit, work, env = tool
    res = _run([deploykit, "export", "--board", "qemu-an547", "--model", "tiny_cnn"],
               cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stderr == "" or res.stderr.startswith("·"), res.stderr  # deploykit's own first
    assert (work / "build/qemu-an547/tiny_cnn/export/model.pte").is_file()
    res = _run([deploykit, "plan", "--board", "qemu-an547", "--model", "tiny_cnn"],
               cwd=work, env=env)
    assert res.returncode == 0, res.stderr
    assert "memory plan of tiny_cnn on qemu-an547" in res.stdout
    res = _run([deploykit, "inspect", "build/qemu-an547/tiny_cnn/export/model.pte"],
               cwd=work, env=env)
    assert res.returncode == 0 and "float32" in res.stdout, res.stderr


@requires_toolchain
@requires_cmake
@requires_qemu
def test_selftest_on_qemu_from_the_wheel(tool):
    deploykit, work, env = tool
    res = _run([deploykit, "selftest", "--board", "qemu-an547", "--quiet"], cwd=work, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stderr == ""
    assert (work / "build/qemu-an547/selftest-ok").is_dir()
