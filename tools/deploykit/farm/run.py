"""One run on a labgrid place: acquire, flash through the place, read, release.

The place is held only while the board is flashed and its results are read; the comparison
with the host happens after the release. The result protocol is read exactly as from a local
board (deploykit.runners.serial_port.read_board), through the place's NetworkSerialPort:
ser2net on the exporter, reached with pyserial's rfc2217:// (or socket:// for a raw port).
The outcome of the run is left on the place as the tag `dk_result` for `deploykit farm
status`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deploykit.errors import DeployKitError
from deploykit.farm.place_flash import flash_place
from deploykit.farm.session import (
    RESULT_TAG,
    FarmError,
    FarmSession,
    PlaceQuery,
    PlaceResource,
    held_place,
)
from deploykit.flashers import FlashImage

Progress = Callable[[str], None]
SERIAL_CLASS = "NetworkSerialPort"


def _quiet(_message: str) -> None:
    pass


def serial_url(resource: PlaceResource) -> str:
    """pyserial's URL for a NetworkSerialPort (ser2net speaks RFC 2217 unless told raw).

    ser2net does not answer RFC 2217's SET_CONTROL (flow control), on which pyserial's client
    waits and times out; labgrid's pyserial fork (pyserial-labgrid, installed with labgrid)
    adds `ign_set_control` to skip the wait, and labgrid's own serial driver uses it too."""
    host, port = resource.params.get("host"), resource.params.get("port")
    if resource.params.get("protocol") == "raw":
        return f"socket://{host}:{port}"
    return f"rfc2217://{host}:{port}?ign_set_control"


def _serial_port(session: FarmSession, place: str, wait_s: float) -> PlaceResource:
    """The place's serial port, once its exporter has started ser2net for it (it does so when
    the place is acquired, and then publishes the TCP port)."""
    deadline = time.monotonic() + wait_s
    while True:
        ports = [r for r in session.resources(place) if r.cls == SERIAL_CLASS]
        if len(ports) > 1:
            raise FarmError(
                f"Place {place} has {len(ports)} serial ports "
                f"({', '.join(r.name for r in ports)}); deploykit reads one.",
                "Give the place only the board's console port.",
            )
        if not ports:
            raise FarmError(
                f"Place {place} has no serial port ({SERIAL_CLASS}).",
                "Add the board's USB serial port to the exporter and the place "
                "(deploykit farm exporter-config writes it).",
            )
        if ports[0].avail and ports[0].params.get("port"):
            return ports[0]
        if time.monotonic() >= deadline:
            raise FarmError(
                f"The serial port of place {place} is not available on its "
                f"exporter ({ports[0].params.get('host')}).",
                "Check that the board is plugged in there and that ser2net is "
                "installed on the exporter.",
            )
        time.sleep(0.2)


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
            flashed = flash_place(
                board, image, session.resources(held.name), held.name, progress=progress
            )
            run.notes.append(flashed.summary())
            run.serial_url = serial_url(_serial_port(session, held.name, 10.0))
            yield run
        except DeployKitError as exc:
            run.outcome = exc.exit_code.name.lower()
            raise
        finally:
            with contextlib.suppress(Exception):
                session.set_tags(held.name, {RESULT_TAG: run.outcome})
