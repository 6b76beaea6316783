"""`deploykit init [DIR]`: a new project that works as written.

It writes three files into DIR (default: the current directory), from templates/project/:

    deploykit.toml          the project file: the model, per-board settings (docs/project.md)
    model.py                a model file: model() and example_inputs(), the optional ones in a
                            comment
    tests/test_on_board.py  the model on a board against the host, with deploykit's pytest
                            plugin (`pytest --board qemu-an547`)

It refuses to overwrite: when any of them exists, it names them and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from deploykit.util.errors import ConfigError
from deploykit.util.fsutil import write_atomic

# What init writes (relative to the project's directory) -> its template.
PROJECT_FILES: dict[str, str] = {
    "deploykit.toml": "deploykit.toml.tmpl",
    "model.py": "model.py.tmpl",
    "tests/test_on_board.py": "test_on_board.py.tmpl",
}


@dataclass(frozen=True)
class Scaffold:
    directory: Path
    files: tuple[Path, ...]

    def summary(self) -> str:
        here = Path.cwd().resolve()
        where = "" if self.directory == here else f"cd {self.directory} && "
        listed = "\n".join(f"  {f.relative_to(self.directory)}" for f in self.files)
        return (f"a deploykit project in {self.directory}:\n{listed}\nnext:\n"
                f"  {where}deploykit run --board qemu-an547    # export, build, run on QEMU, "
                "compare with the host\n"
                f"  {where}pytest --board qemu-an547           # the same, as a test\n"
                "(`deploykit setup` first, once, for the ExecuTorch sources)")


def template_text(name: str) -> str:
    return resources.files("deploykit").joinpath(f"pipeline/templates/project/{name}").read_text()


def init_project(directory: Path | None = None) -> Scaffold:
    """Write the project files into `directory` (module docstring)."""
    root = Path(directory or Path.cwd()).resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} is not a directory.", "Give a directory for the project.")
    existing = [name for name in PROJECT_FILES if (root / name).exists()]
    if existing:
        raise ConfigError(f"{root} already holds {', '.join(existing)}; deploykit init "
                          "overwrites nothing.",
                          "Run it in a new directory (deploykit init DIR), or move those "
                          "files away first.")
    written = []
    for name, template in PROJECT_FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, template_text(template))
        written.append(path)
    return Scaffold(root, tuple(written))
