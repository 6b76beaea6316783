"""The repository stands on its own: no file cites notes outside it or a path of the machine it
was written on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from deploykit.util.paths import checkout_root

# How a citation of notes kept outside the repository would look: the notes' file name, or the
# relative path to the directory beside the checkout. Written in pieces so that this file does
# not itself match and the check covers every tracked file, this one included.
OUTSIDE_NOTES_MARKS = ("FIELD" "-NOTES", ".." "/shared")


def _tracked_text_files():
    root = checkout_root()
    if root is None or shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout (installed deploykit, or git missing)")
    names = subprocess.run(["git", "-C", str(root), "ls-files"], capture_output=True,
                           text=True, check=True).stdout.split()
    for name in names:
        path = root / name
        try:
            yield name, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue


def test_no_file_cites_notes_outside_the_repository():
    offenders = [name for name, text in _tracked_text_files()
                 if any(mark in text for mark in OUTSIDE_NOTES_MARKS)]
    assert offenders == []


def _machine_paths() -> set[str]:
    """Paths of the machine the tests run on, derived rather than written down: the checkout
    itself, the user's home and the sources workspace ($DEPLOYKIT_WORKSPACE) when set."""
    candidates = [checkout_root(), Path.home()]
    if os.environ.get("DEPLOYKIT_WORKSPACE"):
        candidates.append(Path(os.environ["DEPLOYKIT_WORKSPACE"]).resolve())
    return {f"{p}/" for p in candidates if p is not None and p != Path(p.anchor)}


def test_no_file_names_a_path_of_the_machine():
    marks = _machine_paths()
    offenders = [name for name, text in _tracked_text_files()
                 if any(m in text for m in marks)]
    assert offenders == [], f"{sorted(marks)} appear in {offenders}"


def test_ci_runs_the_readme_test_command_with_the_distribution_python():
    root = checkout_root()
    if root is None:
        pytest.skip("installed deploykit: no README or .ci/run")
    readme = (root / "README.md").read_text()
    ci = (root / ".ci" / "run").read_text()
    install, command = "scripts/install --tests", ".venv/bin/python -m pytest -q --board qemu-an547"
    assert f"{install} && {command}" in readme
    # .ci/run's commands are exactly the README's, with the distribution's Python
    commands = [line for line in ci.splitlines()
                if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == [f"PYTHON=/usr/bin/python3 {install}", command]


def test_install_script_parses_and_explains_itself():
    root = checkout_root()
    if root is None or shutil.which("bash") is None:
        pytest.skip("installed deploykit, or no bash")
    script = root / "scripts" / "install"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    res = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0
    for word in ("--torch-index", "--no-link", "PYTHON=", "PEP 668", ".venv"):
        assert word in res.stdout, word
    assert "set -euo" not in res.stdout


def test_test_modules_have_unique_names():
    """tests/ has no __init__.py files, so pytest imports each test module by its basename:
    two files with one name stop the whole suite at collection."""
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a module name"
        seen[path.name] = path


def test_every_test_has_a_time_limit_and_the_install_brings_it(pytestconfig):
    """A hung test fails on its own (pytest-timeout, [tool.pytest.ini_options] timeout)
    instead of holding CI until its own limit: the plugin is in the `test` extra, which
    scripts/install installs, and it is loaded in this very run."""
    root = checkout_root()
    if root is None:
        pytest.skip("installed deploykit: no pyproject.toml or scripts/install")
    pyproject = (root / "pyproject.toml").read_text()
    extra = re.search(r"^test = \[(.*)\]$", pyproject, re.M)
    assert extra is not None and '"pytest-timeout' in extra.group(1)
    assert re.search(r"^timeout = \d+$", pyproject, re.M)
    install = (root / "scripts" / "install").read_text()
    extras = re.search(r"^extras=(\S+)$", install, re.M)
    assert extras is not None and "test" in extras.group(1).split(",")
    assert pytestconfig.pluginmanager.hasplugin("timeout"), (
        "pytest-timeout is not installed: scripts/install --tests (or pip install -e '.[test]')")
    assert float(pytestconfig.getini("timeout")) >= 600
