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
from collections.abc import Callable
from pathlib import Path
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
from deploykit.runners.base import RunResult

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
            raise FarmError(f"Place {place} has {len(ports)} serial ports "
                            f"({', '.join(r.name for r in ports)}); deploykit reads one.",
                            "Give the place only the board's console port.")
        if not ports:
            raise FarmError(f"Place {place} has no serial port ({SERIAL_CLASS}).",
                            "Add the board's USB serial port to the exporter and the place "
                            "(deploykit farm exporter-config writes it).")
        if ports[0].avail and ports[0].params.get("port"):
            return ports[0]
        if time.monotonic() >= deadline:
            raise FarmError(f"The serial port of place {place} is not available on its "
                            f"exporter ({ports[0].params.get('host')}).",
                            "Check that the board is plugged in there and that ser2net is "
                            "installed on the exporter.")
        time.sleep(0.2)


def run_on_place(board: Any, elf: Path, out_dir: Path, *, place: str,
                 coordinator: str | None = None, place_timeout_s: float = 300.0,
                 timeout_s: float = 120.0, check: bool = True,
                 progress: Progress = _quiet) -> RunResult:
    from deploykit.families import family_of
    from deploykit.runners.serial_port import read_board

    elf = Path(elf)
    uf2 = elf.with_suffix(".uf2")
    if not uf2.exists() and elf.exists():
        from deploykit.uf2 import write_uf2

        write_uf2(elf, uf2, family=family_of(board).uf2_family(board))
    query = PlaceQuery.parse(place)
    run_dir = Path(out_dir) / "run"
    with FarmSession(coordinator) as session:
        outcome = "interrupted"
        with held_place(session, query, timeout_s=place_timeout_s, progress=progress) as held:
            try:
                resources = session.resources(held.name)
                flashed = flash_place(board, FlashImage(elf, uf2), resources, held.name,
                                      progress=progress)
                url = serial_url(_serial_port(session, held.name, 10.0))
                result = read_board(board, run_dir, timeout_s=timeout_s, port=url,
                                    check=False, progress=progress,
                                    notes=[f"place {held.name} ({session.address})",
                                           flashed.summary()])
                outcome = result.outcome().exit_code.name.lower()
            except DeployKitError as exc:
                outcome = exc.exit_code.name.lower()
                raise
            finally:
                with contextlib.suppress(Exception):
                    session.set_tags(held.name, {RESULT_TAG: outcome})
    return result.check() if check else result
