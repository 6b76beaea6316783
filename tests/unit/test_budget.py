"""The result bytes a run sends, counted before the build (protocol/budget.py): the bound covers
the exact stream the firmware writes (here encoded by the reference encoder, in the firmware's
chunks), and no more than the failure margin above it."""

from __future__ import annotations

import numpy as np
import pytest

from deploykit.readers.protocol import budget
from tests.protocol_encoder import StreamEncoder


def _run_stream(outputs: list[np.ndarray], sets: int) -> bytes:
    enc = StreamEncoder()
    stream = enc.frame(1, b"h" * budget.HELLO_MAX)  # the largest hello the runner can send
    for k in range(sets):
        for i, a in enumerate(outputs):
            stream += enc.tensor(k * len(outputs) + i, a, chunk_size=budget.CHUNK_BYTES)
    stream += enc.timing(1, 1_000_000, sets)
    stream += enc.memory({n: (1, 2) for n in budget.MEMORY_ENTRIES})
    stream += enc.done(0)
    return stream


@pytest.mark.parametrize("shapes,dtype,sets", [
    ([(1, 10)], np.float32, 1),  # mlp_mnist
    ([(1, 10)], np.int8, 1),
    ([(1, 1000), (3,)], np.float32, 2),
    ([(1, 256), ()], np.float32, 1),  # exactly one chunk; a 0-d output
    ([(0, 4)], np.float32, 1),  # an empty output still sends one chunk
])
def test_the_bound_is_the_stream_plus_the_failure_margin(shapes, dtype, sets):
    outputs = [np.zeros(s, dtype) for s in shapes]
    exact = len(_run_stream(outputs, sets))
    bound = budget.run_bytes([(a.nbytes, a.ndim) for a in outputs], sets)
    assert bound == exact + budget.FAILURE_MARGIN
    t = budget.transcript_bytes([(a.nbytes, a.ndim) for a in outputs], sets)
    assert t % 64 == 0 and bound <= t < bound + 64


def test_mlp_mnist_transcript_is_small():
    assert budget.transcript_bytes([(40, 2)]) == 1152  # was a fixed 16,384 B
