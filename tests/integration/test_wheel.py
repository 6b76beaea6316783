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
import tarfile
import zipfile
from pathlib import Path

import pytest

from deploykit.util.paths import DATA_ITEMS, checkout_root
from tests.markers import requires_cmake, requires_qemu, requires_toolchain

pytestmark = pytest.mark.slow

BUILD_INPUTS = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "tools", *DATA_ITEMS)


def _run(cmd, cwd, env, timeout=600):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def build_wheel(src: Path, dist: Path, env: dict[str, str]) -> Path:
    """The wheel of the checkout copy `src` as a user's tools make it: the source distribution
    first (MANIFEST.in decides what it holds), then the wheel from that sdist (setup.py's
    build_py bundles the data). Without build isolation: the build takes this environment's
    setuptools (the `test` extra), so no package index is needed and any failure is the
    checkout's, reported as a failure with the build's output."""
    dist.mkdir(parents=True, exist_ok=True)
    sdist = _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                  "print(b.build_sdist(sys.argv[1]))", dist], cwd=src, env=env)
    assert sdist.returncode == 0, f"building the sdist failed:\n{sdist.stdout}{sdist.stderr}"
    archive = dist / sdist.stdout.strip().splitlines()[-1]
    unpacked = dist / "sdist"
    with tarfile.open(archive) as tar:
        # Our own sdist, just built. The `filter` argument came in Python 3.11.4 (and 3.10.12);
        # Debian 12's 3.11.2, CI's interpreter, does not take it.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(unpacked, filter="data")
        else:
            tar.extractall(unpacked)
    (tree,) = unpacked.iterdir()
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "--no-index", "-q", "-w", dist, tree], cwd=dist, env=env)
    assert built.returncode == 0, f"building the wheel failed:\n{built.stdout}{built.stderr}"
    (wheel,) = dist.glob("deploykit-*.whl")
    return wheel


def missing_data(wheel: Path) -> list[str]:
    """The data items (paths.DATA_ITEMS) and package data the wheel lacks."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    wanted = [f"deploykit/data/{item}" for item in DATA_ITEMS] + [
        "deploykit/data/firmware/CMakeLists.txt", "deploykit/data/cmake/arm-none-eabi-gcc.cmake",
        "deploykit/build/templates/", "deploykit/readers/schema/",
        "deploykit/readers/protocol/errors.yaml"]
    return [w for w in wanted if not any(n == w or n.startswith(w.rstrip("/") + "/")
                                         for n in names)]


def _copy_checkout(root: Path, src: Path) -> None:
    for item in BUILD_INPUTS:  # build from a copy: the checkout gets no build/ or egg-info
        if (root / item).is_dir():
            shutil.copytree(root / item, src / item,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(root / item, src / item)


def _build_env(base: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DEPLOYKIT_WORKSPACE",
                        "DEPLOYKIT_BOARDS_DIR", "DEPLOYKIT_MODELS_DIR")}
    env["XDG_STATE_HOME"] = str(base / "state")
    return env


@pytest.fixture(scope="module")
def tool(tmp_path_factory):
    """(the venv's deploykit, a fresh working directory, the environment to run it in)."""
    root = checkout_root()
    if root is None:
        pytest.skip("deploykit is installed, not run from a checkout: no sources to build a "
                    "wheel from")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    _copy_checkout(root, src)
    env = _build_env(base)
    wheel = build_wheel(src, base / "dist", env)
    assert missing_data(wheel) == []
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


@pytest.mark.parametrize("damage", ["setup.py", "MANIFEST.in: no firmware",
                                    "MANIFEST.in: no .cmake files"])
def test_a_broken_build_fails_and_is_not_skipped(tmp_path, damage):
    """A build the checkout breaks fails the wheel tests instead of skipping them: a setup.py
    that does not run, a MANIFEST.in that leaves a data directory out of the sdist (setup.py
    then cannot bundle it), or leaves files out (the wheel lacks them)."""
    root = checkout_root()
    if root is None:
        pytest.skip("deploykit is installed, not run from a checkout")
    src = tmp_path / "src"
    _copy_checkout(root, src)
    env = _build_env(tmp_path)
    manifest = src / "MANIFEST.in"
    if damage == "setup.py":
        (src / "setup.py").write_text((src / "setup.py").read_text() + "\nraise SystemExit(1)\n")
        with pytest.raises(AssertionError, match="building the sdist failed"):
            build_wheel(src, tmp_path / "dist", env)
    elif damage == "MANIFEST.in: no firmware":
        manifest.write_text(manifest.read_text().replace("graft firmware\n", ""))
        with pytest.raises(AssertionError, match=r"(?s)building the wheel failed.*/firmware'"):
            build_wheel(src, tmp_path / "dist", env)
    else:
        manifest.write_text(manifest.read_text() + "global-exclude *.cmake\n")
        wheel = build_wheel(src, tmp_path / "dist", env)
        assert missing_data(wheel) == ["deploykit/data/cmake/arm-none-eabi-gcc.cmake"]


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
