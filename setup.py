"""Build step that bundles deploykit's data files into the wheel (see docs/architecture.md,
"Where deploykit's files come from"): boards/, models/, firmware/, cmake/ and west.yml are
copied into deploykit/data/ with the checkout's layout. An editable install skips the copy and
reads them from the checkout. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_ITEMS = ("boards", "models", "firmware", "cmake", "west.yml")  # = deploykit.util.paths


class BuildPyWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        here = Path(__file__).resolve().parent
        dest = Path(self.build_lib) / "deploykit" / "data"
        for item in DATA_ITEMS:
            src, out = here / item, dest / item
            if out.exists():
                shutil.rmtree(out) if out.is_dir() else out.unlink()
            out.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, out, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, out)


setup(cmdclass={"build_py": BuildPyWithData})
