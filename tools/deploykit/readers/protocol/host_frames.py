"""Host -> device frames, version 1 (docs/protocol.md, "Host -> device"): what the host sends to
serve firmware, which runs each sample it receives and answers with the result protocol's
records (outputs, then `sample_done`).

A host frame has the layout of a device record (magic, version 1, type, flags, seq, length,
payload, CRC-32 of version..payload) with types from 0x40:

- `input` (0x40): one chunk of one input of one sample: u32 sample, u16 input, u8 dtype (the
  ScalarType code), u8 ndim, i32 sizes[ndim], u32 offset, then the chunk's bytes. The bytes are
  the input's in its memory order (the dim order the `ready` record gives; channels-last for a
  cortex_m program's 4-D input), chunks in order from offset 0;
- `run` (0x41): u32 sample; the device answers it with the sample's outputs and `sample_done`,
  whose run_seq is this frame's seq (a second `run` of the sample it executed last gets the
  same answer again, without executing it again);
- `end` (0x42): no payload; the device sends `timing`, `memory` and `done`, and stops.

The device's parser is `firmware/protocol/dk_stream.c`; the session that speaks this protocol is
`deploykit.run.stream`.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from enum import IntEnum

from deploykit.readers.protocol.records import MAGIC, MAX_PAYLOAD, SEQ_MODULO, VERSION

INPUT_HEAD_STRUCT = struct.Struct("<IHBB")  # sample, input, dtype, ndim; then sizes, offset
RUN_STRUCT = struct.Struct("<I")  # sample
MAX_NDIM = 8  # the device parser keeps one input header (dk_stream.h DK_STREAM_MAX_NDIM)
# Data bytes per input frame. The device writes them straight into the input, so any size up
# to the frame limit costs it no RAM; smaller chunks cost less to send again after a CRC error.
DEFAULT_CHUNK_BYTES = 4096


class HostType(IntEnum):
    INPUT = 0x40
    RUN = 0x41
    END = 0x42


def input_head_size(ndim: int) -> int:
    """Bytes of an input frame's payload before its data."""
    return INPUT_HEAD_STRUCT.size + 4 * ndim + 4


def encode_frame(ftype: int, seq: int, payload: bytes, *, version: int = VERSION,
                 flags: int = 0) -> bytes:
    """One frame: magic, header, payload, CRC-32 of version..payload."""
    body = struct.pack("<BBBHI", version, int(ftype), flags, seq % SEQ_MODULO,
                       len(payload)) + bytes(payload)
    return MAGIC + body + struct.pack("<I", zlib.crc32(body))


def input_payloads(sample: int, index: int, dtype: int, sizes: Sequence[int], data: bytes,
                   chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[bytes]:
    """The payloads of input `index` of `sample`: its bytes (memory order) in chunks of at
    most `chunk_bytes`, in order; an empty input is one empty chunk."""
    if len(sizes) > MAX_NDIM:
        raise ValueError(f"input {index} has rank {len(sizes)}; host frames carry at most "
                         f"{MAX_NDIM}")
    head = INPUT_HEAD_STRUCT.pack(sample, index, dtype, len(sizes)) + struct.pack(
        f"<{len(sizes)}i", *sizes)
    step = max(1, min(chunk_bytes, MAX_PAYLOAD - input_head_size(len(sizes))))
    offsets = range(0, len(data), step) if data else [0]
    return [head + struct.pack("<I", off) + data[off:off + step] for off in offsets]


def run_payload(sample: int) -> bytes:
    return RUN_STRUCT.pack(sample)


def chunks_of(nbytes: int, ndim: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """How many input frames an input of `nbytes` takes."""
    step = max(1, min(chunk_bytes, MAX_PAYLOAD - input_head_size(ndim)))
    return max(1, math.ceil(nbytes / step))


class HostEncoder:
    """Numbers the host's frames (seq from 0, +1 per frame, wrapping at 65536)."""

    def __init__(self, start_seq: int = 0) -> None:
        self.seq = start_seq % SEQ_MODULO

    def frame(self, ftype: int, payload: bytes) -> tuple[int, bytes]:
        """The frame and the seq it was given."""
        seq = self.seq
        self.seq = (self.seq + 1) % SEQ_MODULO
        return seq, encode_frame(ftype, seq, payload)

    def inputs(self, sample: int, arrays: Sequence[tuple[int, Sequence[int], bytes]],
               chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> bytes:
        """Every input of `sample`, each given as (dtype code, sizes, memory-order bytes)."""
        return b"".join(self.frame(HostType.INPUT, payload)[1]
                        for index, (dtype, sizes, data) in enumerate(arrays)
                        for payload in input_payloads(sample, index, dtype, sizes, data,
                                                      chunk_bytes))

    def run(self, sample: int) -> tuple[int, bytes]:
        return self.frame(HostType.RUN, run_payload(sample))

    def end(self) -> tuple[int, bytes]:
        return self.frame(HostType.END, b"")
