"""The version of the deploykit that runs. Every cache deploykit keeps outside one command
(the ExecuTorch runtimes of a workspace, an export, a fit record, an aarch64 runtime) carries
it in its key, beside the code and files that make the entry's bytes, so that another
deploykit sharing the workspace or the output directory makes its own entry instead of reusing
one it did not make (docs/failures.md, "Another deploykit's files")."""

from __future__ import annotations

import sys
from functools import cache
from importlib import metadata

from deploykit.util.paths import checkout_root

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as the tomli package (a dependency there)
    import tomli as tomllib


@cache
def deploykit_version() -> str:
    """A checkout's version is its own pyproject.toml's (whatever distribution of deploykit
    the environment has installed); an installed wheel's is its distribution's."""
    root = checkout_root()
    if root is not None:
        try:
            return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            pass
    try:
        return metadata.version("deploykit")
    except metadata.PackageNotFoundError:
        return "0.0.0"
