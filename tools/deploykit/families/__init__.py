"""Board families: how the boards of one kind get their firmware built, in what image format,
and where it runs. A board file names its family (`family: mps`); everything family-specific
is asked of the family object, so the pipeline has no `if family == ...`.

Families of other installed packages join through the `deploykit.families` entry point group
(docs/architecture.md, "How to add a board family"), loaded like the built-in ones.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from deploykit.util.errors import ConfigError
from deploykit.util.plugins import load_plugins

if TYPE_CHECKING:
    from deploykit.families.base import BoardFamily

ENTRY_POINT_GROUP = "deploykit.families"
BUILTIN_FAMILIES = {
    "mps": "deploykit.families.mps:MpsFamily",
    "rp2350": "deploykit.families.rp2350:Rp2350Family",
    "linux_aarch64": "deploykit.families.linux_aarch64:LinuxAarch64Family",
}


@cache
def registry() -> dict[str, BoardFamily]:
    from deploykit.families.base import BoardFamily

    return load_plugins(ENTRY_POINT_GROUP, BUILTIN_FAMILIES, BoardFamily, "board family")


def get_family(name: str) -> BoardFamily:
    families = registry()
    if name not in families:
        raise ConfigError(f"Unknown board family '{name}'.",
                          f"Known families: {', '.join(families)} (a board file's `family:`).")
    return families[name]


def family_of(board: Any) -> BoardFamily:
    """The family of `board`, after checking the board has what the family needs."""
    family = get_family(board.family)
    family.check_board(board)
    return family
