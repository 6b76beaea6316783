"""How many result-protocol bytes a runner firmware sends for one model, counted before the build
(docs/protocol.md): the serial link's transcript on USB CDC boards is sized from it
(firmware/boards/rp2350/dk_link.h), so it holds a whole run and no more.

A run of the runner (firmware/runner/runner.cpp) sends, in order: `hello` (built in a 512-byte
buffer), one `tensor` record per chunk of each output of each input set (DK_PROTOCOL_CHUNK_BYTES
data bytes per chunk), `timing`, `memory` (one entry per pool, the stack and the heap, and the
NPU scratch on Ethos-U firmware), `done`. The margin holds what a failing run sends instead of
the rest: an `execute_error` and an `error` record, a `log` record, a fault report (log + fault +
done).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from deploykit.readers.protocol.records import CRC_SIZE, HEADER_SIZE

FRAME_BYTES = HEADER_SIZE + CRC_SIZE
HELLO_MAX = 511  # runner.cpp send_hello(): a 512-byte buffer, NUL-terminated
CHUNK_BYTES = 1024  # dk_protocol.h DK_PROTOCOL_CHUNK_BYTES
TENSOR_HEAD = 20  # index, dtype, ndim, scale, zero point, total bytes, offset (+ 4 x ndim)
TIMING_BYTES = 24
DONE_BYTES = 8
MEMORY_ENTRIES = ("method_pool", "planned_pool", "temp_pool", "stack", "heap", "npu_scratch")
# What a failing run sends instead of the rest: an error record (16 + 4 + a message of at most
# 200 B) after an execute_error record (16 + 12 + a function name of at most 32 B), or a fault
# report (two log lines of at most 80 B, fault 16 + 52, done 16 + 8): 320 B.
# A run that still outgrows the transcript loses nothing on the first session (dk_link.h).
FAILURE_MARGIN = 320


def tensor_bytes(nbytes: int, ndim: int) -> int:
    """The `tensor` records of one output of `nbytes` bytes (an empty one still sends one)."""
    chunks = max(1, math.ceil(nbytes / CHUNK_BYTES))
    return chunks * (FRAME_BYTES + TENSOR_HEAD + 4 * ndim) + nbytes


def run_bytes(outputs: Sequence[tuple[int, int]], input_sets: int = 1) -> int:
    """An upper bound of the bytes a run sends: `outputs` as (nbytes, ndim) per output, the
    largest dtype the device may send them in; each input set sends every output once."""
    memory = sum(1 + len(name) + 8 for name in MEMORY_ENTRIES)
    fixed = (FRAME_BYTES + HELLO_MAX) + (FRAME_BYTES + TIMING_BYTES) \
        + (FRAME_BYTES + memory) + (FRAME_BYTES + DONE_BYTES)
    tensors = input_sets * sum(tensor_bytes(n, d) for n, d in outputs)
    return fixed + tensors + FAILURE_MARGIN


def transcript_bytes(outputs: Sequence[tuple[int, int]], input_sets: int = 1) -> int:
    """The transcript for such a run: its bytes, rounded up to 64."""
    return (run_bytes(outputs, input_sets) + 63) // 64 * 64
