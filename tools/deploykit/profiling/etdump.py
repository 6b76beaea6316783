"""The ETDump of a profiling run, rebuilt on the host from the firmware's event records.

The firmware never holds an ETDump (ExecuTorch's ETDumpGen needs more than 128 KiB of RAM); it
streams its events instead (trace.py). Here they become ExecuTorch's own Python ETDump objects
(`executorch.devtools.etdump.schema_flatcc`), serialized by ExecuTorch's serializer, so that
`executorch.devtools.Inspector(etdump_path=..., etrecord=...)` reads the file. Times are written
in nanoseconds of the event clock, with the tracer's cost taken out (Inspector's
`source_time_scale` is then `TimeScale.NS`).
"""

from __future__ import annotations

import struct
from pathlib import Path

from deploykit.readers.trace import EXECUTE, Profile
from deploykit.util.fsutil import write_atomic

RUN_NAME = "Execute"


def etdump_bytes(profile: Profile) -> bytes:
    """The ETDump (FlatCC flavour, size-prefixed) of every execute() of `profile`."""
    from executorch.devtools.etdump.schema_flatcc import (
        ETDumpFlatCC,
        Event,
        ProfileEvent,
        RunData,
    )
    from executorch.devtools.etdump.serialize import serialize_to_etdump_flatcc

    ns = 1e9 / profile.clock_hz
    runs: list[list] = []
    current: list = []
    windows = [(t.event.start, t.event.end) for t in profile.events if t.event.name == EXECUTE]
    for t in sorted(profile.events, key=lambda t: t.event.end):
        e = t.event
        if not any(start <= e.start and e.end <= end for start, end in windows):
            continue  # load_method's events: ETDumpGen keeps them out of the Execute blocks too
        start = int(round(e.start * ns))
        current.append(
            Event(
                profile_event=ProfileEvent(
                    name=e.name,
                    chain_index=e.chain,
                    instruction_id=e.debug_handle,
                    # The schema's "none" values (-1, ""), as ETDumpGen writes them.
                    delegate_debug_id_int=e.delegate_id if e.delegate_id >= 0 else -1,
                    delegate_debug_id_str="",
                    delegate_debug_metadata=b"",
                    start_time=start,
                    end_time=start + int(round(t.ticks * ns)),
                ),
                allocation_event=None,
                debug_event=None,
            )
        )
        if e.name == EXECUTE:  # sent last of its run: it ends after everything inside it
            runs.append(current)
            current = []
    data = [
        RunData(name=RUN_NAME, bundled_input_index=-1, allocators=[], events=events)
        for events in runs
    ]
    flatbuffer = serialize_to_etdump_flatcc(ETDumpFlatCC(version=0, run_data=data))
    # ETDump files are size-prefixed flatbuffers (ETDumpGen finishes its builder that way, and
    # Inspector reads them so): the standard 32-bit little-endian length before the buffer.
    return struct.pack("<I", len(flatbuffer)) + flatbuffer


def write_etdump(profile: Profile, path: Path) -> Path:
    write_atomic(path, etdump_bytes(profile))
    return path
