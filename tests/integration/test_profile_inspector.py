"""ExecuTorch's Inspector opens deploykit's ETDump with the export's ETRecord, and its
operator names agree with deploykit's (no runtime needed: the event stream was recorded from
profiling firmware on QEMU, tests/data/; the export is real, about 15 s)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("executorch.devtools")

from deploykit.export import ETRECORD_NAME, export  # noqa: E402
from deploykit.models import load_model  # noqa: E402
from deploykit.profiles import PROFILES  # noqa: E402
from deploykit.profiling.etdump import write_etdump  # noqa: E402
from deploykit.profiling.trace import (  # noqa: E402
    NATIVE_CALL_PREFIX,
    profile_from_records,
    program_instructions,
)
from deploykit.protocol import decode  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STREAM = REPO / "tests" / "data" / (
    "profile-mlp_mnist-cortex_m_int8-qemu-an505.bin")


def test_inspector_reads_the_etdump_with_the_etrecord(tmp_path):
    from executorch.devtools import Inspector
    from executorch.devtools.inspector import TimeScale

    # As `deploykit profile --board qemu-an505` exported it: the board's default (size) profile.
    result = export(load_model("mlp_mnist", REPO), "cortex_m_int8", tmp_path / "export",
                    cpu="cortex-m33", options=PROFILES["size"].export_options())
    etrecord = tmp_path / "export" / ETRECORD_NAME
    assert etrecord.is_file()
    records = decode(STREAM.read_bytes())
    # The recorded run is of this very program (the export is reproducible).
    pte = result.pte_path.read_bytes()
    assert records.hello.fields["pte_sha256"] == hashlib.sha256(pte).hexdigest()[:16]
    profile = profile_from_records(records, program_instructions(pte))
    etdump = write_etdump(profile, tmp_path / "model.etdump")

    inspector = Inspector(etdump_path=str(etdump), etrecord=str(etrecord),
                          source_time_scale=TimeScale.NS, target_time_scale=TimeScale.US)
    (block,) = inspector.event_blocks
    ours = {t.event.debug_handle: r.operator for r in profile.rows
            for t in profile.events if t.event.name == "OPERATOR_CALL"
            and t.event.debug_handle in r.instructions}
    native = [e for e in block.events if e.name.startswith(NATIVE_CALL_PREFIX)]
    assert len(native) == 5
    for event in native:
        # Inspector's name (native_call_<op>) is deploykit's operator without its namespace.
        assert ours[event._instruction_id].split("::", 1)[1] == \
            event.name[len(NATIVE_CALL_PREFIX):]
        assert event.op_types  # the ETRecord mapped the instruction to its graph nodes
    execute = next(e for e in block.events if e.name == "Method::execute")
    assert execute.perf_data.raw[0] == pytest.approx(profile.micros(profile.total_ticks),
                                                     rel=1e-3)
