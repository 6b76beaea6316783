"""`explore`'s time and error overlays, built from the files `deploykit profile` and `run
--debug-intermediates` write: the profile and the comparison come from event streams recorded
from profiling firmware on QEMU (tests/data/), read by the profiling module's own functions,
against the very program they were recorded from (committed beside them, laid out as the
export directory; nothing is exported, so nothing depends on the host's float path). The
overlays' keys are checked against the .pte's instruction list; the adapter's node ids in a
real Model Explorer environment are checked by tests/integration/test_explore.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from deploykit.profiling import explore
from deploykit.profiling.intermediates import compare_intermediates
from deploykit.profiling.stage import DebugReport, ProfileReport
from deploykit.program.inspect import inspect_pte
from deploykit.readers.protocol import decode
from deploykit.readers.trace import profile_from_records, program_instructions
from deploykit.run.runners.qemu import DEFAULT_ICOUNT_SHIFT
from deploykit.util.errors import ConfigError
from tests.perturb import perturb_requantize_scale
from tests.recorded import (
    MLP_DEBUG_STREAM,
    MLP_PROFILE_STREAM,
    MLP_PTE,
    TINY_CNN_PROFILE_STREAM,
    first_input,
    lay_out_export,
    short_sha,
)
from tests.unit.test_profiling import TINY_CNN_FP32

PROFILE_STREAM = MLP_PROFILE_STREAM
OTHER_PROFILE_STREAM = TINY_CNN_PROFILE_STREAM
DEBUG_STREAM = MLP_DEBUG_STREAM


def lay_out_recorded_program(out: Path) -> Path:
    """mlp_mnist, cortex_m_int8 (size profile, cortex-m33), in <out>/export/ as `deploykit
    profile --board qemu-an505 --model mlp_mnist --flow cortex_m_int8` lays it out: the
    program the streams of tests/data/ were recorded from, copied. Returns `out`."""
    lay_out_export(out, MLP_PTE)
    for stream in (PROFILE_STREAM, DEBUG_STREAM):
        assert decode(stream.read_bytes()).hello.fields["pte_sha256"] == short_sha(
            _pte(out).read_bytes()
        )
    return out


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return lay_out_recorded_program(tmp_path_factory.mktemp("mlp_mnist"))


def _pte(out: Path) -> Path:
    return out / "export" / "model.pte"


def _program(out: Path) -> dict[tuple[int, int], str]:
    return {k: v.name for k, v in program_instructions(_pte(out).read_bytes()).items()}


def write_profile(
    out: Path, stream: Path = PROFILE_STREAM, instructions: dict | None = None
) -> tuple[Path, dict]:
    """<out>/profile/profile.json as the profile stage writes it, from a recorded stream (of
    the program whose `instructions` are given, by default the export's)."""
    profile = profile_from_records(
        decode(stream.read_bytes()),
        instructions or program_instructions(_pte(out).read_bytes()),
    )
    profile.unit, profile.scale = (
        "instructions",
        1e9 / ((1 << DEFAULT_ICOUNT_SHIFT) * profile.clock_hz),
    )
    report = ProfileReport(
        "qemu-an505", "mlp_mnist", "cortex_m_int8", profile, None, out, {}, None
    ).json()
    path = out / "profile" / "profile.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path, report


def write_intermediates(out: Path, pte: bytes, drop_instruction: int | None = None) -> Path:
    records = decode(DEBUG_STREAM.read_bytes())
    if drop_instruction is not None:
        records.trace_tensors = [
            t for t in records.trace_tensors if t.debug_handle != drop_instruction
        ]
    inputs = first_input()  # the first input set, as the debug run fed the device
    report = compare_intermediates(records, pte, inputs, atol=0.01, rtol=0.0)
    path = out / "debug" / "intermediates.json"
    path.parent.mkdir(exist_ok=True)
    result = DebugReport("qemu-an505", "mlp_mnist", "cortex_m_int8", report, path)
    path.write_text(json.dumps(result.json(), indent=2, allow_nan=False) + "\n")
    return path


def _method_nodes(out: Path) -> list[explore.AdapterNode]:
    """The method graph's nodes by the adapter's naming: graph inputs/outputs (no
    instruction) and one node per instruction."""
    nodes = [explore.AdapterNode(explore.METHOD, "forward_inputs", "inputs", "")]
    for chain, index in sorted(program_instructions(_pte(out).read_bytes())):
        nodes.append(
            explore.AdapterNode(
                explore.METHOD,
                explore.instruction_node_id(chain, index),
                "op",
                "KernelCall",
            )
        )
    return nodes


def test_profile_overlay_has_every_instruction_with_its_time(out):
    path, report = write_profile(out)
    program = _program(out)
    assert len(program) == inspect_pte(_pte(out)).num_instructions == 5
    time, share = explore.profile_overlays(path, program)
    assert time.name == "time (instructions per run)"
    assert set(time.values) == set(share.values) == set(program)
    # The three linear layers share one operator row: per instruction they add up to it.
    linear = next(r for r in report["operators"] if r["operator"].endswith("quantized_linear.out"))
    assert linear["program_instructions"] == [1, 2, 3]
    per_run = linear["ticks"] * report["clock"]["units_per_tick"] / report["iterations"]
    # under QEMU the row's time is in instructions, under its unit's own key
    assert linear[report["clock"]["unit"]] == pytest.approx(per_run * report["iterations"])
    assert sum(time.values[(0, i)] for i in (1, 2, 3)) == pytest.approx(per_run)
    assert all(program[(0, i)] == "cortex_m::quantized_linear.out" for i in (1, 2, 3))
    # Every instruction's time, together: the operators' part of execute().
    assert sum(share.values.values()) == pytest.approx(
        100 * report["operators_ticks"] / report["execute_ticks"]
    )
    assert sum(time.values.values()) == pytest.approx(
        report["operators_ticks"] * report["clock"]["units_per_tick"] / report["iterations"]
    )
    assert all(v > 0 for v in time.values.values())


def test_profile_node_data_file_is_keyed_by_the_adapters_node_ids(out, tmp_path):
    path, _ = write_profile(out)
    time, _ = explore.profile_overlays(path, _program(out))
    values = explore.overlay_values(time, _method_nodes(out))
    assert sorted(values) == [("forward", f"forward_0_{i}") for i in range(5)]
    written = json.loads(
        explore.node_data_file(
            tmp_path / "time.json", time.name, values, explore.HEAT_GRADIENT
        ).read_text()
    )
    assert [g["stop"] for g in written["forward"]["gradient"]] == [0.0, 1.0]
    results = written["forward"]["results"]
    assert written["forward"]["name"] == "time (instructions per run)"
    assert "forward_inputs" not in results  # no instruction, no value invented
    assert results["forward_0_1"]["value"] == pytest.approx(time.values[(0, 1)])


def test_intermediates_overlay_is_each_instructions_max_error(out):
    pte = _pte(out).read_bytes()
    # The device's outputs against a program whose second linear layer (instruction 2) has
    # its output scale changed by 20%: it and everything after it differ.
    path = write_intermediates(out, perturb_requantize_scale(pte, instruction=2, factor=0.8))
    report = json.loads(path.read_text())
    overlay = explore.intermediates_overlay(path, _program(out))
    assert overlay.values[(0, 0)] == 0 and overlay.values[(0, 1)] == 0
    assert overlay.values[(0, 2)] > 1
    assert overlay.values[(0, 2)] == max(
        r["max_abs"] for r in report["operators"] if r["instruction"] == 2
    )


def test_an_instruction_without_a_device_output_gets_no_error_value(out):
    path = write_intermediates(out, _pte(out).read_bytes(), drop_instruction=3)
    overlay = explore.intermediates_overlay(path, _program(out))
    assert set(overlay.values) == {(0, 0), (0, 1), (0, 2), (0, 4)}
    assert all(v == 0 for v in overlay.values.values())  # CMSIS-NN is bit-exact
    values = explore.overlay_values(overlay, _method_nodes(out))
    assert ("forward", "forward_0_3") not in values and len(values) == 4


def test_a_profile_of_another_program_is_refused(out, tmp_path):
    # tiny_cnn's profile read against mlp_mnist's .pte: the instructions do not match.
    _, report = write_profile(out, OTHER_PROFILE_STREAM, TINY_CNN_FP32)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(report))
    with pytest.raises(
        ConfigError,
        match=r"not of this program: its instruction 0:0 is aten::convolution.out, the "
        r"\.pte's is cortex_m::quantize_per_tensor.out",
    ):
        explore.profile_overlays(path, _program(out))


def test_a_profile_without_instruction_times_says_to_profile_again(out, tmp_path):
    _, report = write_profile(out)
    del report["instructions"]
    path = tmp_path / "old-profile.json"
    path.write_text(json.dumps(report))
    with pytest.raises(ConfigError, match="no per-instruction times") as exc:
        explore.profile_overlays(path, _program(out))
    assert "deploykit profile" in exc.value.hint


def test_the_out_directorys_files_are_picked_up_and_said(out):
    profile, _ = write_profile(out)
    debug = write_intermediates(out, _pte(out).read_bytes())
    said: list[str] = []
    found = explore.find_data_files(_pte(out), None, None, True, said.append)
    assert found == explore.DataFiles(profile, debug)
    assert said == [f"overlaying {profile}", f"overlaying {debug}"]
    # Not with auto off, and not a file older than the .pte (of an earlier export).
    assert explore.find_data_files(_pte(out), None, None, False, said.append) == (
        explore.DataFiles(None, None)
    )
    stamp = _pte(out).stat().st_mtime
    os.utime(debug, (stamp - 60, stamp - 60))
    said.clear()
    found = explore.find_data_files(_pte(out), None, None, True, said.append)
    assert found == explore.DataFiles(profile, None)
    assert said[1].startswith(f"not overlaying {debug}: it is older than model.pte")


def test_a_given_file_that_is_missing_is_a_clear_error(out, tmp_path):
    with pytest.raises(ConfigError, match="No such file"):
        explore.find_data_files(_pte(out), tmp_path / "none.json", None, True, print)
