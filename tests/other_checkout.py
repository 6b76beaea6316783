"""Another deploykit beside this one, for the tests of what two deploykits sharing an output
directory or a workspace do (docs/failures.md, "Another deploykit's files"): this checkout's
package and data files copied elsewhere (so its firmware/ and cmake/ are another source tree),
optionally under another version, and run as its own process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from deploykit.util.paths import DATA_ITEMS, data_root


def copy_checkout(dest: Path, version: str | None = None) -> Path:
    """A copy of this checkout at `dest` (the package, boards, models, firmware, cmake,
    west.yml, pyproject.toml), with `version` in its pyproject.toml when given."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for item in (*DATA_ITEMS, "tools", "pyproject.toml"):
        source = data_root() / item
        if source.is_dir():
            shutil.copytree(source, dest / item, ignore=ignore)
        else:
            shutil.copy2(source, dest / item)
    if version is not None:
        pyproject = dest / "pyproject.toml"
        text, count = re.subn(r'(?m)^version = ".*"$', f'version = "{version}"',
                              pyproject.read_text(), count=1)
        assert count == 1, "pyproject.toml has no version line"
        pyproject.write_text(text)
    return dest


def run_python(checkout: Path, args: list[str], cwd: Path,
               timeout: float = 300) -> subprocess.CompletedProcess:
    """`python ARGS` with `checkout`'s package first on the path, in `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(checkout / "tools")}
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
