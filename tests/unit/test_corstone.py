"""Corstone-300/-320 boards: board files, the NPU section and its overrides, the FVP command line
and run loop (against a stand-in FVP executable), Vela scratch read from a real Ethos-U `.pte`,
the NPU memory plan and its fit check.

The Arm FVPs and the Ethos-U driver are not on this machine; nothing here needs them. The
`.pte` tests export tiny_cnn for real (about 5 s)."""

from __future__ import annotations

import copy
import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

from deploykit.readers import npu as npu_mod
from deploykit.readers.boards import _schema, board_from_dict, load_board
from deploykit.readers.npu import (
    NPU_MACS,
    memory_mode_layout,
    npu_config,
    parse_target,
    with_npu_overrides,
)
from deploykit.run.runners import FvpRunner, runner_for_board
from deploykit.run.runners.fvp import FVP_DIR_ENV
from deploykit.util.errors import ConfigError, EnvironmentProblem, ExitCode, MemoryPlanError

REPO = Path(__file__).resolve().parents[2]
K, M = 1024, 1024 * 1024


def _raw(name: str) -> dict:
    return yaml.safe_load((REPO / "boards" / f"{name}.yaml").read_text())


# ---- board files -------------------------------------------------------------------------


def test_corstone_boards_load_with_their_npu():
    c300, c320 = load_board("corstone-300"), load_board("corstone-320")
    n300, n320 = npu_config(c300), npu_config(c320)
    assert (n300.target, n300.system_config, n300.memory_mode) == (
        "ethos-u55-128", "Ethos_U55_High_End_Embedded", "Shared_Sram")
    assert (n320.target, n320.system_config, n320.memory_mode) == (
        "ethos-u85-256", "Ethos_U85_SYS_DRAM_Mid", "Shared_Sram")
    assert "Dedicated_Sram_384KB" in n320.memory_modes
    assert (n300.base, n300.irq) == (0x58102000, 56)
    assert (n320.base, n320.irq) == (0x50004000, 16)
    for b in (c300, c320):
        assert b.export["default"] == "ethos_u_int8"
        assert b.runner["kind"] == "fvp" and b.family == "mps"
        assert b.console["kind"] == "cmsdk-uart"
    assert (c300.console["base"], c320.console["base"]) == (0x59303000, 0x58203000)
    assert npu_config(load_board("qemu-an547")) is None


def test_memory_maps_follow_the_corstone_linker_scripts():
    def regions(name):
        return {r.name: (r.origin, r.size) for r in load_board(name).memory}

    r300 = regions("corstone-300")
    assert r300["itcm"] == (0x10000000, 512 * K) and r300["bram"] == (0x11000000, 1 * M)
    assert r300["dtcm"] == (0x30000000, 512 * K) and r300["sram"] == (0x31000000, 2 * M)
    assert r300["qspi"] == (0x38000000, 8 * M) and r300["ddr"][0] == 0x70000000
    r320 = regions("corstone-320")
    assert r320["itcm"] == (0x10000000, 32 * K) and r320["bram"] == (0x12000000, 2 * M)
    assert r320["dtcm"] == (0x30000000, 32 * K) and r320["sram"] == (0x31000000, 4 * M)
    assert r320["ddr"] == (0x70000000, 256 * M)
    # the NPU's AXI ports name real regions: SRAM for the scratch, DDR for the model
    for name in ("corstone-300", "corstone-320"):
        n = npu_config(load_board(name))
        assert (n.sram_region, n.ext_region) == ("sram", "ddr")


def test_corstone_320_builds_m55_code_and_says_so():
    b = load_board("corstone-320")
    assert b.cpu["core"] == "cortex-m85"
    assert "-mcpu=cortex-m55" in b.cpu_flags
    assert not any("cortex-m85" in f for f in b.cpu_flags)  # GCC 12 rejects it
    assert "cortex-m85" in b.cpu["note"].lower() and "m55" in b.cpu["note"].lower()


def test_schema_mac_sets_match_the_code():
    rules = _schema()["properties"]["npu"]["allOf"]
    by_type = {r["if"]["properties"]["type"]["const"]: r["then"]["properties"]["macs"]["enum"]
               for r in rules}
    assert {t: tuple(v) for t, v in by_type.items()} == NPU_MACS


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["npu"].__setitem__("macs", 100), "npu/macs"),
    (lambda d: d["npu"].__setitem__("type", "ethos-u99"), "npu/type"),
    (lambda d: d["npu"]["vela"].__setitem__("memory_mode", "Fast"), "npu/vela/memory_mode"),
    (lambda d: d["runner"].pop("macs_param"), "runner"),
])
def test_board_schema_refuses_bad_npu_and_fvp_sections(tmp_path, edit, where):
    data = _raw("corstone-320")
    edit(data)
    with pytest.raises(ConfigError) as exc:
        board_from_dict(data, tmp_path / "corstone-320.yaml")
    assert where in exc.value.cause


def test_u55_board_cannot_name_a_dedicated_sram_mode(tmp_path):
    data = _raw("corstone-300")
    data["npu"]["vela"]["memory_mode"] = "Dedicated_Sram_384KB"
    with pytest.raises(ConfigError, match="npu/vela/memory_mode"):
        board_from_dict(data, tmp_path / "corstone-300.yaml")


def test_boards_command_lists_them(capsys):
    from deploykit.cli import main

    assert main(["boards"]) == 0
    text = capsys.readouterr().out
    assert "corstone-300" in text and "corstone-320" in text
    assert "npu ethos-u85-256 at 0x50004000 irq 16" in text


# ---- NPU overrides: one field for Vela and the FVP ----------------------------------------


def test_npu_macs_override_is_validated_per_npu_type():
    c300, c320 = load_board("corstone-300"), load_board("corstone-320")
    assert npu_config(with_npu_overrides(c320, 512)).target == "ethos-u85-512"
    assert npu_config(with_npu_overrides(c300, 32)).target == "ethos-u55-32"
    for board, bad in ((c320, 64), (c320, 4096), (c300, 512), (c300, 0)):
        with pytest.raises(ConfigError) as exc:
            with_npu_overrides(board, bad)
        assert str(bad) in exc.value.cause and "MACs" in exc.value.hint
    assert npu_config(c320).macs == 256  # the board itself is untouched
    with pytest.raises(ConfigError, match="has no NPU"):
        with_npu_overrides(load_board("qemu-an547"), 128)


def test_memory_mode_override_must_be_one_of_the_boards():
    c300, c320 = load_board("corstone-300"), load_board("corstone-320")
    assert npu_config(with_npu_overrides(c320, memory_mode="Dedicated_Sram_384KB")
                      ).memory_mode == "Dedicated_Sram_384KB"
    with pytest.raises(ConfigError, match="not supported by the ethos-u55"):
        with_npu_overrides(c300, memory_mode="Dedicated_Sram_384KB")
    with pytest.raises(ConfigError, match="board corstone-320's memory modes"):
        with_npu_overrides(c320, memory_mode="Dedicated_Sram_512KB")


def test_memory_mode_layouts():
    assert memory_mode_layout("Shared_Sram") == npu_mod.MemoryModeLayout(
        "Shared_Sram", "ext", "sram", 0)
    assert memory_mode_layout("Sram_Only").model == "sram"
    d = memory_mode_layout("Dedicated_Sram_384KB")
    assert (d.model, d.scratch, d.fast_scratch) == ("ext", "ext", 384 * K)
    assert memory_mode_layout("Dedicated_Sram").fast_scratch == npu_mod.DEFAULT_FAST_SCRATCH
    assert parse_target("ethos-u85-1024") == ("ethos-u85", 1024)
    with pytest.raises(ConfigError):
        parse_target("ethos-u55-512")


def _fvp_args(cmd: list[str]) -> dict[str, str]:
    return dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "-C")


@pytest.mark.parametrize("board, binary, macs_param", [
    ("corstone-300", "FVP_Corstone_SSE-300_Ethos-U55", "ethosu.num_macs"),
    ("corstone-320", "FVP_Corstone_SSE-320", "mps4_board.subsystem.ethosu.num_macs"),
])
def test_fvp_command_line_comes_from_the_board_file(tmp_path, board, binary, macs_param):
    b = load_board(board)
    runner = runner_for_board(b)
    assert isinstance(runner, FvpRunner)
    console = tmp_path / "console.bin"
    cmd = runner.command(Path("/fw/dk_runner.elf"), console_file=console, timelimit_s=30)
    assert cmd[0] == binary and cmd[-2:] == ["-a", "/fw/dk_runner.elf"]
    assert cmd[cmd.index("--timelimit") + 1] == "30"
    args = _fvp_args(cmd)
    uart = b.runner["uart"]
    assert args[macs_param] == str(npu_config(b).macs)
    assert args[f"{uart}.out_file"] == str(console)
    assert args[f"{uart}.unbuffered_output"] == "1"
    assert args[f"{uart}.shutdown_on_eot"] == "1"
    assert args[f"{b.runner['telnet']}.start_telnet"] == "0"
    assert args[f"{b.runner['semihosting']}.semihosting-enable"] == "1"
    for key, value in b.runner["params"].items():
        assert args[key] == str(value)
    # exactly one MAC parameter, and no other num_macs anywhere
    assert [k for k in args if k.endswith("num_macs")] == [macs_param]


@pytest.mark.parametrize("macs", [128, 512, 2048])
def test_mac_override_reaches_vela_and_the_fvp_together(macs):
    b = with_npu_overrides(load_board("corstone-320"), macs)
    settings = npu_config(b).export_settings()
    args = _fvp_args(runner_for_board(b).command(Path("x.elf"), console_file=Path("c")))
    assert settings["target"] == f"ethos-u85-{macs}"
    assert args["mps4_board.subsystem.ethosu.num_macs"] == str(macs)


def test_fvp_params_may_not_set_the_mac_count():
    section = dict(load_board("corstone-320").runner)
    section["params"] = {**section["params"], "mps4_board.subsystem.ethosu.num_macs": 512}
    with pytest.raises(ConfigError, match="npu.macs"):
        FvpRunner(section, npu_macs=256)


def test_fvp_telnet_console_mode():
    runner = FvpRunner.from_board(load_board("corstone-300"), console="telnet")
    args = _fvp_args(runner.command(Path("x.elf"), port=5123))
    assert args["mps3_board.telnetterminal0.mode"] == "raw"
    assert args["mps3_board.telnetterminal0.start_port"] == "5123"
    assert "mps3_board.uart0.out_file" not in args


def test_missing_fvp_says_where_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv(FVP_DIR_ENV, str(tmp_path / "nowhere"))
    runner = runner_for_board(load_board("corstone-320"))
    with pytest.raises(EnvironmentProblem) as exc:
        runner.run(tmp_path / "fw.elf", tmp_path)
    assert exc.value.exit_code == ExitCode.ENVIRONMENT
    assert "FVP_Corstone_SSE-320 not found" in exc.value.cause
    assert "Arm Ecosystem FVP" in exc.value.hint and FVP_DIR_ENV in exc.value.hint


# ---- the run loop, against a stand-in FVP ------------------------------------------------

_FAKE_FVP = """\
#!{python}
# Stand-in for an Arm FVP: records its argv, writes a result stream to the UART out_file
# named by -C, and exits with $FAKE_FVP_EXIT.
import json, os, sys
sys.path[:0] = {path!r}
from tests.protocol_encoder import StreamEncoder
import numpy as np
args = sys.argv[1:]
params = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-C")
json.dump(args, open(os.environ["FAKE_FVP_ARGV"], "w"))
out = next(v for k, v in params.items() if k.endswith("uart0.out_file"))
e = StreamEncoder()
stream = (b"boot banner\\r\\n" + e.hello(board="corstone-320", firmware="fake")
          + e.tensor(0, np.arange(4, dtype=np.float32))
          + e.done(int(os.environ.get("FAKE_DONE_STATUS", "0"))))
with open(out, "wb") as f:
    for i in range(0, len(stream), 7):
        f.write(stream[i:i + 7]); f.flush()
print("Info: /OSCI/SystemC: Simulation stopped by user.")
sys.exit(int(os.environ.get("FAKE_FVP_EXIT", "0")))
"""


@pytest.fixture
def fake_fvp(tmp_path, monkeypatch):
    fvp_dir = tmp_path / "fvp" / "models" / "Linux64_GCC-9.3"
    fvp_dir.mkdir(parents=True)
    exe = fvp_dir / "FVP_Corstone_SSE-320"
    exe.write_text(_FAKE_FVP.format(python=sys.executable,
                                    path=[str(REPO / "tools"), str(REPO), *sys.path]))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv(FVP_DIR_ENV, str(tmp_path / "fvp"))
    monkeypatch.setenv("FAKE_FVP_ARGV", str(tmp_path / "argv.json"))
    (tmp_path / "fw.elf").write_bytes(b"\x7fELF")
    return tmp_path


def test_fvp_run_decodes_the_uart_file(fake_fvp):
    board = with_npu_overrides(load_board("corstone-320"), 1024)
    result = runner_for_board(board).run(fake_fvp / "fw.elf", fake_fvp / "out", timeout_s=30)
    assert result.outcome().ok and result.exit_code == 0
    assert result.records.hello.board == "corstone-320"
    assert result.records.tensors[0].data.tolist() == [0.0, 1.0, 2.0, 3.0]
    args = json.loads((fake_fvp / "argv.json").read_text())
    assert "mps4_board.subsystem.ethosu.num_macs=1024" in args  # the override, not 256
    assert (fake_fvp / "out/run/fvp.log").read_text().startswith("$ ")


def test_fvp_nonzero_exit_fails_a_passing_stream(fake_fvp, monkeypatch):
    monkeypatch.setenv("FAKE_FVP_EXIT", "3")
    result = runner_for_board(load_board("corstone-320")).run(
        fake_fvp / "fw.elf", fake_fvp / "out", timeout_s=30, check=False)
    assert result.records.done is not None
    outcome = result.outcome()
    assert outcome.exit_code == ExitCode.PROTOCOL and "status 3" in outcome.cause


def test_fvp_device_error_is_reported_as_such(fake_fvp, monkeypatch):
    monkeypatch.setenv("FAKE_DONE_STATUS", "1")
    result = runner_for_board(load_board("corstone-320")).run(
        fake_fvp / "fw.elf", fake_fvp / "out", timeout_s=30, check=False)
    assert result.outcome().exit_code == ExitCode.DEVICE_ERROR


# ---- a real Ethos-U .pte: Vela scratch, segments, plan ------------------------------------


@pytest.fixture(scope="module")
def tiny_u85(tmp_path_factory):
    from deploykit.program.export import export
    from deploykit.program.models import load_model

    out = tmp_path_factory.mktemp("tiny-u85")
    settings = npu_config(load_board("corstone-320")).export_settings()
    return export(load_model("tiny_cnn", REPO), "ethos_u_int8", out, cpu="cortex-m85",
                  settings=settings)


def test_vela_scratch_read_from_the_pte(tiny_u85):
    from executorch.backends.arm.scripts.get_ethosu_scratch_from_pte import (
        get_scratch_from_pte,
    )

    from deploykit.program.inspect import inspect_pte, parse_vela_stream

    info = inspect_pte(tiny_u85.pte_path)
    (d,) = info.delegates
    assert d.backend == "EthosUBackend" and d.target == "ethos-u85-256"
    assert (d.system_config, d.memory_mode) == ("Ethos_U85_SYS_DRAM_Mid", "Shared_Sram")
    assert d.vela.scratch_size > 0 and d.vela.cmd_bytes > 0 and d.vela.weight_bytes > 0
    assert list(d.vela.blocks)[0] == "vela_bin_stream"
    assert list(d.vela.blocks)[-1] == "vela_end_stream"
    # ExecuTorch's own reader agrees
    assert get_scratch_from_pte(str(tiny_u85.pte_path)) == d.scratch_size == info.max_scratch
    assert d.vela.inputs[0].shape[-3:] == (3, 8, 8) and d.vela.inputs[0].elem_size == 1
    assert parse_vela_stream(b"not a vela stream at all, just bytes....") is None


def test_segments_and_partition_report(tiny_u85):
    from deploykit.api import describe_program, program_json
    from deploykit.program.inspect import inspect_pte

    info = inspect_pte(tiny_u85.pte_path)
    kinds = [s.kind for s in info.segments]
    assert kinds == ["cpu", "delegate", "cpu"]
    assert info.segments[0].ops == ("cortex_m::quantize_per_tensor.out",)
    assert info.cpu_fallback_ops == ()
    ops = info.delegates[0].ops
    assert ops["aten::convolution"] == 2 and "aten::linear" in ops
    assert "export.json" in info.partition_source
    j = program_json(info)
    assert [s["kind"] for s in j["segments"]] == kinds
    assert j["segments"][1]["scratch_size"] == info.max_scratch
    text = describe_program(info)
    assert "CPU fallback ops: none" in text and "scratch" in text
    # without the report beside it, the ops inside are unknown but nothing else changes
    other = inspect_pte(tiny_u85.pte_path, report=tiny_u85.pte_path.parent / "absent.json")
    assert other.delegates[0].ops is None and other.max_scratch == info.max_scratch


def test_vela_estimate_per_delegate(tiny_u85):
    """Vela's cycle estimate is kept from the export and shown, labelled as an estimate."""
    from deploykit.api import describe_program, program_json
    from deploykit.program.inspect import inspect_pte

    info = inspect_pte(tiny_u85.pte_path)
    est = info.delegates[0].vela_estimate
    vela = json.loads((tiny_u85.pte_path.parent / "export.json").read_text()
                      )["partition"]["delegates"][0]["vela"]
    assert est is not None and est.total_cycles == vela["total_cycles"] > 0
    assert est.npu_cycles <= est.total_cycles
    assert est.macs == vela["network_macs"] > 0 and est.npu_macs_per_cycle == 256
    assert 0 < est.mac_utilisation <= 1
    assert "NPU (Vela estimate): " in describe_program(info)
    j = program_json(info)["segments"][1]["npu_estimate"]
    assert j["source"] == "Vela estimate" and j["total_cycles"] == est.total_cycles
    other = inspect_pte(tiny_u85.pte_path, report=tiny_u85.pte_path.parent / "absent.json")
    assert other.delegates[0].vela_estimate is None


def test_vela_summary_first_label_wins():
    from deploykit.flows.vela import parse_summary

    text = ("Total   SRAM bandwidth                           0.25 MB/batch\n"
            "Total   SRAM bandwidth            per input      0.01 MB/inference\n"
            "Total cycles                                     1234 cycles/batch\n")
    assert parse_summary(text) == {"sram_mb": 0.25, "total_cycles": 1234}


def test_npu_plan_places_scratch_by_memory_mode(tiny_u85):
    from deploykit.memory.plan import plan_memory
    from deploykit.program.inspect import inspect_pte

    info = inspect_pte(tiny_u85.pte_path)
    plan = plan_memory(load_board("corstone-320"), info)
    by_name = {i.name.split(" (")[0]: i for i in plan.items}
    assert by_name["Ethos-U scratch"].region == "sram"
    assert by_name["Ethos-U scratch"].size >= info.max_scratch
    assert by_name["model"].region == "ddr"
    assert plan.fits


def test_fit_check_refuses_a_shrunken_sram(tiny_u85, tmp_path):
    from deploykit.memory.plan import plan_memory
    from deploykit.program.inspect import inspect_pte

    data = _raw("corstone-320")
    for region in data["memory"]:
        if region["name"] == "sram":
            region["size"] = 1024  # smaller than the Vela scratch
    board = board_from_dict(data, tmp_path / "corstone-320.yaml")
    with pytest.raises(MemoryPlanError) as exc:
        plan_memory(board, inspect_pte(tiny_u85.pte_path))
    assert exc.value.exit_code == ExitCode.MEMORY
    assert "region 'sram'" in exc.value.cause and "OVER" in exc.value.cause
    assert "Ethos-U scratch" in exc.value.cause
    assert "--npu-memory-mode Dedicated_Sram_384KB" in exc.value.hint


def test_plan_refuses_a_pte_built_for_another_mac_count(tiny_u85):
    from deploykit.memory.plan import plan_memory
    from deploykit.program.inspect import inspect_pte

    board = with_npu_overrides(load_board("corstone-320"), 512)
    with pytest.raises(ConfigError, match="ethos-u85-256.*ethos-u85-512"):
        plan_memory(board, inspect_pte(tiny_u85.pte_path))
    with pytest.raises(ConfigError, match="has no NPU"):
        plan_memory(load_board("qemu-an547"), inspect_pte(tiny_u85.pte_path))


def test_every_board_with_an_npu_resolves():
    for path in sorted((REPO / "boards").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        if "npu" in data:
            cfg = npu_config(copy.deepcopy(data))
            assert cfg.macs in NPU_MACS[cfg.type]
            assert cfg.memory_mode in cfg.memory_modes


def test_npu_records_are_tied_to_their_delegate_and_vela_estimate(tiny_u85):
    """The run report pairs each device npu record with its delegate and Vela's estimate."""
    from deploykit.program.inspect import inspect_pte
    from deploykit.readers.protocol import NpuRun, RunRecords
    from deploykit.run.report import npu_calls_of

    program = inspect_pte(tiny_u85.pte_path)
    estimate = program.delegates[0].vela_estimate.total_cycles
    runs = [NpuRun(call, 3000 + call, 9000, {"idle_cycles": 7, "mac_active_cycles": 100})
            for call in range(3)]  # three inferences of a one-delegate program
    calls = npu_calls_of(RunRecords(npu_runs=runs), program)
    assert [(c.call, c.delegate, c.npu_cycles) for c in calls] == [(0, 0, 3000), (1, 0, 3001),
                                                                    (2, 0, 3002)]
    assert all(c.vela_estimate_cycles == estimate for c in calls)
    text = calls[0].describe()
    assert text.startswith("NPU call 0 (delegate 0): 3,000 NPU cycles, 9,000 CPU ticks")
    assert f"Vela estimated {estimate:,} cycles" in text and "mac_active_cycles 100" in text
    assert npu_calls_of(RunRecords(npu_runs=runs),
                      inspect_pte(tiny_u85.pte_path, report=tiny_u85.pte_path.parent / "x")
                      )[0].vela_estimate_cycles is None
