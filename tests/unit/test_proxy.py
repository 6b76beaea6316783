"""Fit by proxy (run/proxy.py): a board that is not attached is measured on the simulated board its
board file names, built with the board's CPU/ABI flags; the record says where the peaks came
from and adds the board's own runtime's stack."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest

from deploykit.memory import fit as fitting
from deploykit.memory.plan import plan_memory
from deploykit.pipeline.target import resolve_target
from deploykit.readers.boards import board_from_dict, load_board
from deploykit.run import proxy as proxying
from deploykit.run.runners import RUNNERS, Runner
from deploykit.util.errors import ConfigError, EnvironmentProblem
from tests.unit.test_fit import PEAKS, _memory, _program


def _board_with(raw_changes: dict[str, Any], name: str = "pico2"):
    board = load_board(name)
    data = {**board.raw, **raw_changes}
    return board_from_dict(data, board.path)


def test_pico2_names_an505_and_the_proxy_gets_the_pico_cpu():
    pico = load_board("pico2")
    assert pico.raw["proxy"]["board"] == "qemu-an505"
    proxy = proxying.proxy_board(pico)
    an505 = load_board("qemu-an505")
    # the proxy's map, console, timer and runner ...
    assert proxy.name == "qemu-an505" and proxy.memory == an505.memory
    assert proxy.console == an505.console and proxy.runner == an505.runner
    # ... with the Pico's softfp FPU + DSP flags, not an505's hard-float ones
    assert proxy.cpu_flags == pico.cpu_flags
    assert "-mfloat-abi=softfp" in proxy.cpu_flags and "-mfloat-abi=hard" not in proxy.cpu_flags
    assert an505.cpu["float_abi"] == "hard"


def test_proxy_section_is_schema_checked(tmp_path):
    pico = load_board("pico2")
    for bad in ({"board": "qemu-an505"},  # extra_stack is required
                {"board": "qemu-an505", "extra_stack": -1},
                {"board": "qemu-an505", "extra_stack": 0, "cpu": "x"}):
        with pytest.raises(ConfigError, match="proxy"):
            board_from_dict({**pico.raw, "proxy": bad}, pico.path)


def test_a_proxy_must_be_a_simulator_with_the_same_core():
    with pytest.raises(ConfigError, match="not a simulator"):
        proxying.proxy_board(_board_with({"proxy": {"board": "pico2", "extra_stack": 0}}))
    with pytest.raises(ConfigError, match="cortex-m55"):
        proxying.proxy_board(_board_with({"proxy": {"board": "qemu-an547", "extra_stack": 0}}))
    with pytest.raises(ConfigError, match="Unknown board"):
        proxying.proxy_board(_board_with({"proxy": {"board": "no-such-board",
                                                    "extra_stack": 0}}))
    no_proxy = {k: v for k, v in load_board("pico2").raw.items() if k != "proxy"}
    with pytest.raises(ConfigError, match="names no proxy"):
        proxying.proxy_board(board_from_dict(no_proxy, load_board("pico2").path))


class _FakePico(Runner):
    kind = "pico"
    options = RUNNERS["pico"].options
    attached: ClassVar[bool] = False

    @classmethod
    def from_board(cls, board: Any, **kwargs: Any) -> Runner:
        return cls()

    def check_environment(self) -> str:
        if not self.attached:
            raise EnvironmentProblem("No pico2 is connected: none in BOOTSEL mode.", "plug it in")
        return "pico2 running on /dev/ttyACM0"

    def run(self, elf: Path, out_dir: Path, **kwargs: Any) -> Any:
        raise AssertionError("not run here")


@pytest.fixture
def fake_pico(monkeypatch):
    monkeypatch.setitem(RUNNERS, "pico", _FakePico)
    _FakePico.attached = False
    return _FakePico


def test_no_board_attached_measures_on_the_proxy(fake_pico):
    said: list[str] = []
    target = proxying.measure_target(resolve_target("pico2"), {"workspace": None}, said.append)
    assert target.proxy == "qemu-an505" and target.board.name == "qemu-an505"
    assert target.runner.kind == "qemu" and target.runner.is_simulator
    assert target.extra_stack == load_board("pico2").raw["proxy"]["extra_stack"]
    assert target.where == ("measured on qemu-an505 (proxy: same core, ABI and runtime "
                            "options)")
    assert "no pico2 attached" in said[0] and "proxy qemu-an505" in said[0]
    gen, build = proxying.measurement_dirs(Path("out"), target)
    assert gen == Path("out/fit/proxy/generated") and build == Path("out/fit/proxy/firmware")


def test_an_attached_board_or_a_named_port_measures_on_the_board(fake_pico):
    fake_pico.attached = True
    target = proxying.measure_target(resolve_target("pico2"), {}, lambda _m: None)
    assert target.proxy is None and target.board.name == "pico2" and target.extra_stack == 0
    fake_pico.attached = False
    target = proxying.measure_target(resolve_target("pico2"), {"port": "/dev/ttyACM3"},
                                     lambda _m: None)
    assert target.proxy is None  # the user named a board: measure there (or fail there)


def test_simulated_boards_measure_on_themselves():
    target = proxying.measure_target(resolve_target("qemu-an505"), {}, lambda _m: None)
    assert target.proxy is None and target.board.name == "qemu-an505"
    assert target.where == "measured on qemu-an505"


def test_a_proxy_record_adds_the_extra_stack_and_says_where():
    board = load_board("pico2")
    record = fitting.record_from_run(
        "k", {}, board, "cortex_m_int8", _memory(PEAKS), None,
        measured_on=proxying.PROXY_SOURCE.format(proxy="qemu-an505"), extra_stack=500)
    assert record.extra_stack == 512  # 16-byte aligned
    assert record.fitted["stack"] == fitting.fitted_stack(PEAKS["stack"]) + 512
    assert record.fitted["method_pool"] == fitting.fitted_pool(PEAKS["method_pool"])
    assert "qemu-an505 (proxy" in record.source and "+ 512 B for pico2" in record.source
    plan = plan_memory(board, _program(), sizing=record.sizing())
    assert plan.stack_size == record.fitted["stack"]
    stack = next(i for i in plan.items if i.name == "stack")
    assert "+ 512 B for pico2's own runtime" in stack.detail and "proxy" in stack.detail
    method = next(i for i in plan.items if i.name == "method pool")
    assert "qemu-an505 (proxy" in method.detail and "512" not in method.detail


def test_the_fit_key_covers_the_proxy():
    board = load_board("pico2")
    opts = fitting.fit_options(_program(), resolve_target(board), {})
    assert opts["proxy"]["board"] == "qemu-an505"
    changed = _board_with({"proxy": {**board.raw["proxy"],
                                     "extra_stack": board.raw["proxy"]["extra_stack"] + 256}})
    changed_opts = fitting.fit_options(_program(), resolve_target(changed), {})
    assert fitting.fit_key(changed_opts) != fitting.fit_key(opts)
    assert "proxy" not in fitting.fit_options(_program(), resolve_target("qemu-an505"), {})
    # an older record (no measured_on) still loads and reads as measured on the target
    rec = dataclasses.replace(fitting.record_from_run("k", {}, board, "f", _memory(PEAKS), None))
    assert rec.source == "measured on the target"
