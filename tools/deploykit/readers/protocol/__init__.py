"""The deploykit result protocol, version 1 (docs/protocol.md), host side.

- `records`: frame constants, payload layouts and the record types;
- `decoder`: the streaming `Decoder`, its `DecodeStats`, and `RunRecords` (one run's records);
- `outcome`: how a run ended, as an `Outcome` with the CLI's exit code;
- `host_frames`: the host -> device frames the host sends to serve firmware (samples to run).

The reference encoder of device records is test code (`tests/protocol_encoder.py`): nothing in
deploykit sends device records, the firmware does.
"""

from __future__ import annotations

from deploykit.readers.protocol.decoder import Decoder, DecodeStats, RunRecords, decode
from deploykit.readers.protocol.outcome import Outcome, classify
from deploykit.readers.protocol.records import (
    CFSR_BITS,
    CRC_SIZE,
    DEFAULT_MAX_TENSOR_BYTES,
    FAULT_REGISTERS,
    HEADER_SIZE,
    HFSR_BITS,
    MAGIC,
    MAX_PAYLOAD,
    NPU_HEAD_STRUCT,
    SCALAR_TYPE_NAMES,
    SCALAR_TYPES,
    SEQ_MODULO,
    UINT64_MAX,
    VERSION,
    DeviceError,
    Done,
    DoneStatus,
    ExecuteError,
    Fault,
    Hello,
    Log,
    Memory,
    NpuRun,
    Ready,
    Record,
    RecordType,
    SampleDone,
    Tensor,
    TensorSpec,
    Timing,
)

__all__ = [
    "CFSR_BITS", "CRC_SIZE", "DEFAULT_MAX_TENSOR_BYTES", "FAULT_REGISTERS", "HEADER_SIZE",
    "HFSR_BITS", "MAGIC", "MAX_PAYLOAD", "NPU_HEAD_STRUCT", "SCALAR_TYPES", "SCALAR_TYPE_NAMES",
    "SEQ_MODULO", "UINT64_MAX", "VERSION", "DecodeStats", "Decoder", "DeviceError", "Done",
    "DoneStatus", "ExecuteError", "Fault", "Hello", "Log", "Memory", "NpuRun", "Outcome",
    "Ready", "Record", "RecordType", "RunRecords", "SampleDone", "Tensor", "TensorSpec",
    "Timing", "classify", "decode",
]
