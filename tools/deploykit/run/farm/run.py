"""One run on a labgrid place: acquire, flash through the place, read, release.

The place is held only while the board is flashed and its results are read; the comparison
with the host happens after the release. The result protocol is read exactly as from a local
board (deploykit.run.runners.serial_port.read_board), through the place's NetworkSerialPort:
ser2net on the exporter, reached with pyserial's rfc2217:// (or socket:// for a raw port).
The outcome of the run is left on the place as the tag `dk_result` for `deploykit farm
status`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deploykit.run.farm.place_flash import flash_place, network_serial_port, serial_url
from deploykit.run.farm.session import (
    RESULT_TAG,
    FarmSession,
    PlaceQuery,
    describe_error,
    held_place,
)
from deploykit.run.flashers import FlashImage
from deploykit.util.errors import DeployKitError

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass
class PlaceRun:
    """A held and flashed place: where to read the results, what was done, and the outcome
    the caller sets for the place's `dk_result` tag."""

    place: str
    serial_url: str
    notes: list[str]
    outcome: str = "interrupted"


@contextlib.contextmanager
def on_place(
    board: Any,
    image: FlashImage,
    *,
    place: str,
    coordinator: str | None = None,
    place_timeout_s: float = 300.0,
    progress: Progress = _quiet,
) -> Iterator[PlaceRun]:
    """Acquire a place (`place`: a name or TAG=VALUE,...), flash `image` through it and hold
    it while the body reads the board; release it however the body ends."""
    query = PlaceQuery.parse(place)
    with (
        FarmSession(coordinator) as session,
        held_place(session, query, timeout_s=place_timeout_s, progress=progress) as held,
    ):
        run = PlaceRun(held.name, "", [f"place {held.name} ({session.address})"])
        try:
            flashed = flash_place(board, image, held.name, session, progress=progress)
            run.notes.append(flashed.summary())
            run.serial_url = serial_url(
                network_serial_port(lambda: session.resources(held.name), held.name)
            )
            yield run
        except DeployKitError as exc:
            run.outcome = exc.exit_code.name.lower()
            raise
        finally:
            leave_result(session, held.name, run.outcome, progress)


def leave_result(session: FarmSession, place: str, outcome: str,
                 progress: Progress = _quiet) -> bool:
    """Tag `place` with the run's outcome (`dk_result`, shown by `deploykit farm status`).
    A tag that cannot be set does not fail the run, but it is said: a stale tag would
    otherwise show the previous run's outcome as this one's."""
    try:
        session.set_tags(place, {RESULT_TAG: outcome})
    except Exception as exc:  # gRPC's errors (the place is gone, the coordinator is away)
        progress(f"warning: could not tag {place} with {RESULT_TAG}={outcome} on "
                 f"{session.address}: {describe_error(exc)}; `deploykit farm status` shows an "
                 "older result")
        return False
    return True
