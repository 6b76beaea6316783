"""A .pte deploykit did not make, as the model (program/imported.py): programs written with
ExecuTorch's Python API alone (tests/foreign_programs.py) are read, given their flow, checked
against the board before anything is compiled, imported with deterministic inputs and their
host reference, and planned. No sources needed; the runs on QEMU and the Ethos-U85 program of
ExecuTorch's aot_arm_compiler.py are tests/integration/test_foreign_program_on_boards.py."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from deploykit import api
from deploykit.cli import main
from deploykit.program.imported import (
    INTERPRETER_REFERENCE,
    NO_REFERENCE,
    PYBINDINGS_REFERENCE,
    deterministic_inputs,
    read_program,
)
from deploykit.util.errors import ConfigError, ExitCode
from tests import foreign_programs


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    """The three programs of tests/foreign_programs.py, made once for this module."""
    out = tmp_path_factory.mktemp("foreign")
    return {make.__name__: make(out / f"{make.__name__}.pte")
            for make in (foreign_programs.portable, foreign_programs.xnnpack,
                         foreign_programs.cortex_m)}


def _eager(inputs: list[np.ndarray]) -> np.ndarray:
    net, _ = foreign_programs.small_net()
    with torch.no_grad():
        return net(*[torch.from_numpy(x) for x in inputs]).numpy()


def test_each_program_gets_the_flow_of_its_runtime(programs):
    assert read_program(programs["portable"]).flow == "portable_fp32"
    assert read_program(programs["xnnpack"]).flow == "xnnpack_fp32"
    cortex_m = read_program(programs["cortex_m"])
    assert cortex_m.flow == "cortex_m_int8"
    assert "cortex_m::quantized_linear.out" in cortex_m.reason


def test_the_inputs_are_deterministic_real_valued_data_of_the_program(programs):
    info = read_program(programs["portable"]).info
    first, again = deterministic_inputs(info), deterministic_inputs(info)
    assert len(first) == 1 and first[0].shape == (1, 3, 8, 8) and first[0].dtype == np.float32
    assert np.array_equal(first[0], again[0])
    assert len(np.unique(first[0])) > 100 and -1 <= first[0].min() < 0 < first[0].max() <= 1


def test_a_portable_program_is_imported_with_its_pybindings_reference(programs, tmp_path,
                                                                       capsys):
    out = tmp_path / "portable"
    assert main(["export", "--no-project", "--board", "qemu-an547", "--model",
                 str(programs["portable"]), "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "portable_fp32: the program" in text and "portable operators only" in text
    report = json.loads((out / "export" / "export.json").read_text())
    assert report["imported"]["source"] == str(programs["portable"])
    assert report["reference"]["kind"] == PYBINDINGS_REFERENCE
    assert report["op_list"] == ["aten::addmm.out", "aten::convolution.out", "aten::mean.out",
                                 "aten::permute_copy.out", "aten::relu.out"]
    assert (out / "export" / "model.pte").read_bytes() == programs["portable"].read_bytes()
    with np.load(out / "export" / "reference.npz") as npz:
        inputs, reference = [npz["input_0"]], npz["output_0"]
    np.testing.assert_allclose(reference, _eager(inputs), atol=1e-5)
    # The plan comes from the program itself.
    plan = api.plan("qemu-an547", str(programs["portable"]), out=out, project=False)
    assert list(plan.planned_buffers) == list(read_program(programs["portable"])
                                              .info.planned_buffers)


def test_an_xnnpack_program_goes_to_a_cortex_a_board_only(programs, tmp_path):
    result = api.export("rpi5", str(programs["xnnpack"]), out=tmp_path / "x", project=False)
    assert (result.flow, result.reference_kind) == ("xnnpack_fp32", PYBINDINGS_REFERENCE)
    np.testing.assert_allclose(result.host_outputs[0], _eager(result.inputs), atol=1e-4)
    with pytest.raises(ConfigError) as exc:
        api.command("qemu-an547", str(programs["xnnpack"]), project=False)
    assert "has an XnnpackBackend delegate" in exc.value.cause
    assert "qemu-an547 is a cortex-m55" in exc.value.cause
    assert "rpi5" in exc.value.hint


def test_a_cortex_m_program_runs_on_the_host_through_its_operators(programs, tmp_path):
    result = api.export("qemu-an547", str(programs["cortex_m"]), out=tmp_path / "c",
                        project=False)
    assert (result.flow, result.reference_kind) == ("cortex_m_int8", INTERPRETER_REFERENCE)
    step = result.output_quant[0].scale  # the program ends in a dequantize: int8 steps
    assert result.tolerance == {"atol": pytest.approx(2 * step), "rtol": 0.0}
    assert np.abs(result.host_outputs[0] - _eager(result.inputs)).max() < 8 * step
    with pytest.raises(ConfigError) as exc:
        api.command("rpi5", str(programs["cortex_m"]), project=False)
    cause = exc.value.cause
    assert "cortex_m:: operators (CMSIS-NN)" in cause and "kernels for Cortex-M cores" in cause
    assert "rpi5 is a cortex-a76" in cause


def test_a_program_fixes_its_flow(programs):
    with pytest.raises(ConfigError, match=r"--flow cortex_m_int8: the program .* is "
                       r"portable_fp32 \(portable operators only\)"):
        api.command("qemu-an547", str(programs["portable"]), flow="cortex_m_int8",
                    project=False)
    cmd = api.command("qemu-an547", str(programs["portable"]), project=False)
    assert cmd.target.flow.name == "portable_fp32" and cmd.target.program is not None


def test_a_program_the_runtime_cannot_load_is_refused_naming_both_formats(programs, tmp_path):
    import executorch.version

    data = bytearray(programs["portable"].read_bytes())
    assert data[4:8] == b"ET12"
    data[4:8] = b"ET13"
    newer = tmp_path / "newer.pte"
    newer.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as exc:
        api.command("qemu-an547", str(newer), project=False)
    assert "format ET13" in exc.value.cause and "loads format ET12" in exc.value.cause
    assert f"ExecuTorch {executorch.version.__version__}" in exc.value.cause
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"\0" * 64)
    with pytest.raises(ConfigError, match="is not an ExecuTorch program"):
        api.command("qemu-an547", str(junk), project=False)


@pytest.fixture(scope="module")
def ethos_u85_program(tmp_path_factory) -> Path:
    """An Ethos-U85-256 program (tiny_cnn through the ethos_u_int8 flow for corstone-320),
    for the NPU checks; ExecuTorch's own aot_arm_compiler.py makes one with sources."""
    out = tmp_path_factory.mktemp("u85")
    result = api.export("corstone-320", "tiny_cnn", out=out, project=False)
    program = out / "u85.pte"
    program.write_bytes(result.pte_path.read_bytes())  # without its export.json beside it
    return program


def test_an_npu_program_must_match_the_board_npu(ethos_u85_program):
    with pytest.raises(ConfigError) as exc:
        api.command("corstone-300", str(ethos_u85_program), project=False)
    assert "compiled by Vela for ethos-u85-256" in exc.value.cause
    assert "corstone-300 has an ethos-u55-128 NPU" in exc.value.cause
    with pytest.raises(ConfigError, match="qemu-an547 has no NPU"):
        api.command("qemu-an547", str(ethos_u85_program), project=False)
    with pytest.raises(ConfigError, match=r"--npu-macs 512: the program .* was compiled by "
                       r"Vela for ethos-u85-256 \(256 MACs\)"):
        api.command("corstone-320", str(ethos_u85_program), npu_macs=512, project=False)
    cmd = api.command("corstone-320", str(ethos_u85_program), project=False)
    assert (cmd.target.flow.name, cmd.target.npu.target) == ("ethos_u_int8", "ethos-u85-256")


def test_an_npu_program_has_no_host_reference_but_expected_outputs_may_give_one(
        ethos_u85_program, tmp_path):
    result = api.export("corstone-320", str(ethos_u85_program), out=tmp_path / "n",
                        project=False)
    assert result.reference_kind == NO_REFERENCE
    assert [a.shape for a in result.host_outputs] == [(1, 10)]  # placeholders of its shape
    expected = tmp_path / "expected.npz"
    np.savez(expected, output_0=np.linspace(-1, 1, 10, dtype=np.float32).reshape(1, 10))
    cmd = api.command("corstone-320", str(ethos_u85_program), expect=expected, project=False)
    assert cmd.target.program.expect == expected
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, output_0=np.zeros((1, 9), dtype=np.float32))
    from deploykit.pipeline.chains import export_stage

    bad = api.command("corstone-320", str(ethos_u85_program), expect=wrong, project=False)
    with pytest.raises(ConfigError, match=r"output_0 is \[1, 9\]; output 0 of u85.pte is "
                       r"\[1, 10\]"):
        export_stage(bad.target, str(ethos_u85_program), tmp_path / "w", lambda _m: None)
    good = export_stage(cmd.target, str(ethos_u85_program), tmp_path / "e", lambda _m: None)
    assert good.reference_kind.startswith("expected outputs")
    np.testing.assert_array_equal(good.host_outputs[0], np.load(expected)["output_0"])


def test_config_and_a_project_file_name_a_program(programs, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "net.pte").write_bytes(programs["cortex_m"].read_bytes())
    (project / "deploykit.toml").write_text('model = "net.pte"\n')
    res = subprocess.run([sys.executable, "-m", "deploykit", "config", "--json", "--board",
                          "qemu-an505"], cwd=project, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    settings = json.loads(res.stdout)["settings"]
    assert settings["model"]["value"] == str(project / "net.pte")
    assert settings["flow"] == {"value": "cortex_m_int8",
                                "source": "the program net.pte (its operators and delegates)"}
    res = subprocess.run([sys.executable, "-m", "deploykit", "config", "--board", "rpi5"],
                         cwd=project, capture_output=True, text=True, timeout=300)
    assert res.returncode == ExitCode.CONFIG and "Traceback" not in res.stderr
    assert "deploykit.toml line 1 (model)" in res.stderr and "rpi5 is a cortex-a76" in res.stderr


def test_matrix_gives_a_program_its_own_flow(programs):
    from deploykit.pipeline.matrix import combinations

    combos = combinations(["qemu-an547", "rpi5"], [str(programs["cortex_m"]), "tiny_cnn"],
                          None, ["speed"])
    flows = {(c.board, Path(c.model).name, c.flow) for c in combos}
    assert ("qemu-an547", "cortex_m.pte", "cortex_m_int8") in flows
    assert ("rpi5", "cortex_m.pte", "cortex_m_int8") in flows  # a row that says why not
    assert ("qemu-an547", "tiny_cnn", "portable_fp32") in flows
    assert not any(f == "portable_fp32" for _b, m, f in flows if m == "cortex_m.pte")


def test_a_run_with_nothing_to_compare_says_so_and_passes_only_when_asked(
        ethos_u85_program, tmp_path, monkeypatch):
    """An NPU program without --expect: the device's outputs are printed and the run exits
    NOT_COMPARED, or 0 with --no-compare. The firmware build and the device are stand-ins (a
    decoded record stream), so this runs without sources or an FVP."""
    from types import SimpleNamespace

    from deploykit.pipeline import chains
    from deploykit.readers.protocol.decoder import decode
    from deploykit.readers.protocol.records import RecordType
    from deploykit.run.runners.base import RunResult
    from tests.protocol_encoder import StreamEncoder

    cmd = api.command("corstone-320", str(ethos_u85_program), project=False, runs=True)
    exported = chains.export_stage(cmd.target, cmd.model, tmp_path, lambda _m: None)
    device_output = np.linspace(-0.5, 0.5, 10, dtype=np.float32).reshape(1, 10)

    def fake_build(target, model, out, workspace, progress, **kwargs):
        planned = SimpleNamespace(export=exported, fit=None, program=cmd.target.program.info)
        firmware = SimpleNamespace(elf=tmp_path / "dk_runner.elf",
                                   sizes=SimpleNamespace(flash_total=1234))
        return SimpleNamespace(planned=planned, firmware=firmware)

    class FakeRunner:
        kind = "fvp"

        def run(self, elf, out, timeout_s, check):
            enc = StreamEncoder()
            stream = enc.hello(protocol="1") + enc.tensor(0, device_output)
            stream += enc.frame(RecordType.DONE, struct.pack("<II", 0, enc.count))
            log = tmp_path / "console.bin"
            log.write_bytes(stream)
            return RunResult(decode(stream), exit_code=0, wall_seconds=0.1, console_log=log,
                             runner_log=None, runner="FVP", supports_exit_code=True)

    monkeypatch.setattr(chains, "build_firmware", fake_build)
    target = SimpleNamespace(**{f: getattr(cmd.target, f) for f in ("board", "flow")},
                             make_runner=lambda *_a: FakeRunner())
    report = chains.run_firmware(target, cmd.model, tmp_path, None, 10.0, lambda _m: None)
    assert not report.passed and report.exit_code == ExitCode.NOT_COMPARED
    assert report.verdict is None and "nothing to compare" in report.cause
    assert "--expect FILE.npz" in report.cause and "--no-compare" in report.cause
    text = report.summary()
    assert "reference: none; the outputs below were not compared with anything" in text
    assert "device output 0: [-0.5, -0.38889" in text
    accepted = chains.run_firmware(target, cmd.model, tmp_path, None, 10.0, lambda _m: None,
                                   no_compare=True)
    assert accepted.passed and accepted.exit_code == ExitCode.OK
