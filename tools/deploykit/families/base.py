"""The BoardFamily type: what a family of boards declares and how it builds an image."""

from __future__ import annotations

import abc
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from deploykit.util.errors import ConfigError

if TYPE_CHECKING:
    from deploykit.build.firmware import Firmware
    from deploykit.readers.boards import Board
    from deploykit.readers.sources import Workspace

Progress = Callable[[str], None]


class BoardFamily(abc.ABC):
    """One family of boards (firmware/boards/<board_support>). Subclasses set the class
    attributes and implement `build_image`."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # Upstream projects of west.yml the family's firmware needs besides the ExecuTorch
    # runtime's own (a board-specific group, e.g. the pico-sdk).
    projects: ClassVar[tuple[str, ...]] = ()
    image_formats: ClassVar[tuple[str, ...]] = ("elf",)
    # True: deploykit's startup code and C runtime (firmware/boards/<family>, the lean libc);
    # False: an SDK's (its crt0, printf, malloc and exit wrappers).
    owns_c_runtime: ClassVar[bool] = True
    # Directories under firmware/ that a runner image of this family is built from, besides
    # the runner, the protocol encoder and the shared board API (memory/fit.py keys measurements
    # on their contents).
    firmware_dirs: ClassVar[tuple[str, ...]]
    runners: ClassVar[tuple[str, ...]]  # runner kinds (runners.RUNNERS) its boards may use
    # Whether its firmware links with LTO when the build profile asks for it (pipeline/profiles.py);
    # False turns a profile's DK_LTO off for its boards, so that a proxy measurement
    # (run/proxy.py) builds with the same runtime options as the board.
    supports_lto: ClassVar[bool] = True
    # Sections of the board file its boards must have, beyond the common ones.
    required_sections: ClassVar[tuple[str, ...]] = ()

    def check_board(self, board: Board) -> None:
        """Raise ConfigError when `board` lacks what this family needs."""
        missing = [s for s in self.required_sections if s not in board.raw]
        if missing:
            raise ConfigError(f"Board {board.name} (family {self.name}) has no "
                              f"{', '.join(f'`{s}:`' for s in missing)} section.",
                              "See docs/boards.md for what each family needs.")
        kind = board.runner.get("kind")
        if kind not in self.runners:
            raise ConfigError(f"Board {board.name} (family {self.name}) names runner kind "
                              f"{kind!r}.", f"Family {self.name} runs on: "
                              f"{', '.join(self.runners)}.")

    def build_definitions(self, board: Board, workspace: Workspace) -> dict[str, str]:
        """CMake definitions a runner build of `board` needs from the workspace."""
        return {}

    def uf2_family(self, board: Board) -> str | None:
        """The UF2 family id name of the board's images, for families flashed as UF2."""
        return None

    @abc.abstractmethod
    def build_image(self, board: Board, generated_dir: Path, build_dir: Path, firmware: str,
                    definitions: dict[str, str] | None = None,
                    progress: Progress | None = None) -> Firmware:
        """Build `firmware` ("selftest" or "runner") against the rendered files in
        `generated_dir`."""

    def describe(self) -> str:
        return (f"{self.name}: {self.summary}; images {', '.join(self.image_formats)}; "
                f"runners {', '.join(self.runners)}"
                + ("" if self.owns_c_runtime else "; the SDK's C runtime"))
