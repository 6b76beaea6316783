"""The tests themselves: a hard dependency is imported, never skipped on, so that a broken
install fails instead of quietly skipping."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Import names of pyproject's dependencies whose distribution name differs.
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "pyserial": "serial",
    "pyelftools": "elftools",
    "qemu.qmp": "qemu",
    "jinja2": "jinja2",
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
