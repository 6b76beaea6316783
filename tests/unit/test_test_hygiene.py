"""The tests themselves: a hard dependency is imported, never skipped on, so that a broken
install fails instead of quietly skipping."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lines import Deadline, Lines

ROOT = Path(__file__).resolve().parents[2]
# Import names of pyproject's dependencies whose distribution name differs.
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "pyserial": "serial",
    "pyelftools": "elftools",
    "qemu.qmp": "qemu",
    "jinja2": "jinja2",
    "scikit-learn": "sklearn",
}


def _hard_dependencies() -> set[str]:
    # pyproject's `dependencies = [...]` (tomllib is Python 3.11+; deploykit runs on 3.10).
    block = re.search(
        r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.M | re.S
    )
    assert block is not None
    deps = re.findall(r'"([^"]+)"', block.group(1))
    names = {re.split(r"[\[<>=!~ ]", d, maxsplit=1)[0].lower() for d in deps}
    imports = {IMPORT_NAMES.get(n, n) for n in names}
    # executorch[ethos-u] brings torch and Vela.
    return imports | {"torch", "ethosu"}


def test_hard_dependencies_are_not_skipped_on():
    hard = _hard_dependencies()
    assert {"torch", "executorch", "numpy", "rich"} <= hard
    offenders = []
    for path in (ROOT / "tests").rglob("*.py"):
        for m in re.finditer(r"importorskip\(\s*[\"']([\w.]+)", path.read_text()):
            if m.group(1).split(".")[0] in hard:
                offenders.append(f"{path.relative_to(ROOT)}: importorskip({m.group(1)!r})")
    assert offenders == []


# ---- commands taken from PATH -----------------------------------------------------------------

# A program a test starts by bare name comes from whatever PATH holds: on a fresh machine
# `python3` is the distribution's (no torch, no deploykit), and `deploykit` or `pip` may be
# missing or belong to another environment. Tests start sys.executable (`-m deploykit`,
# `-m pip`) or a path they made; a test that is about the PATH lookup itself goes here, with
# its reason, keyed by (file under tests/, enclosing function, program).
BARE = re.compile(r"^(python[0-9.]*|pip[0-9.]*|deploykit)$")
ALLOWED_FROM_PATH: dict[tuple[str, str, str], str] = {}


def bare_commands(source: str) -> list[tuple[int, str, str]]:
    """(line, enclosing function, program) of each command in `source` that starts a Python,
    pip or deploykit by bare name: a list or tuple literal whose first item is such a name
    (subprocess's argv), a shell string that begins with one (shell=True), or
    shutil.which() of one."""
    found: list[tuple[int, str, str]] = []

    def first_word(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            word = node.value.strip().split(" ", 1)[0] if node.value.strip() else ""
            return word if BARE.match(word) else None
        return None

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.List | ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) \
                    and BARE.match(first.value):
                found.append((node.lineno, function, first.value))
        if isinstance(node, ast.Call) and node.args:
            name = ast.unparse(node.func)
            shell = any(k.arg == "shell" and isinstance(k.value, ast.Constant) and k.value.value
                        for k in node.keywords)
            word = first_word(node.args[0])
            if word and (shell or name in ("shutil.which", "which", "os.system")):
                found.append((node.lineno, function, word))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), "<module>")
    return found


def test_the_bare_command_scan_finds_each_form():
    sample = (
        "import shutil, subprocess, sys\n"
        "def a():\n    subprocess.run(['python3', '-m', 'deploykit'])\n"
        "def b():\n    subprocess.run(('pip', 'install', 'x'))\n"
        "def c():\n    subprocess.run('deploykit boards', shell=True)\n"
        "def d():\n    return shutil.which('python')\n"
        "def e():\n    subprocess.run([sys.executable, '-m', 'deploykit'])\n"
        "def f():\n    subprocess.run(['git', 'status']); x = ['deploykit.cli', 'python-x']\n"
    )
    assert [(f, p) for _, f, p in bare_commands(sample)] == [
        ("a", "python3"), ("b", "pip"), ("c", "deploykit"), ("d", "python")]


def test_no_test_starts_python_pip_or_deploykit_from_path():
    found = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = str(path.relative_to(ROOT / "tests"))
        for line, function, program in bare_commands(path.read_text()):
            found[(rel, function, program)] = f"tests/{rel}:{line}"
    offenders = [f"{where}: {program} (in {function})"
                 for (rel, function, program), where in found.items()
                 if (rel, function, program) not in ALLOWED_FROM_PATH]
    assert offenders == [], "start sys.executable or a path instead of PATH's program"
    # An allowance whose command is gone would hide the next one of that name.
    assert [k for k in ALLOWED_FROM_PATH if k not in found] == []


# ---- waits with a deadline (tests/lines.py) ----------------------------------------------------


def test_a_silent_child_fails_the_wait_at_its_deadline():
    """A child that writes one line and then hangs: waiting for a second line ends at the
    deadline (a loop that checks its deadline only when a line arrives would wait forever)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('first', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )
    try:
        lines = Lines(child.stdout)
        assert lines.wait_for("^first", 60) == "first\n"
        t0 = time.monotonic()
        with pytest.raises(Deadline, match="first"):
            lines.wait_for("^second", 0.5)
        assert time.monotonic() - t0 < 30  # the deadline, not the child's 600 s
    finally:
        child.kill()
        child.wait()
    assert lines.rest(30) == "" and lines.eof  # killed: the end of its output
