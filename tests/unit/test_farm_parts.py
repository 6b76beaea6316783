"""The farm's pieces that need no coordinator: the --place query, the choice of a flasher
among a place's resources, the exporter configuration from the board file, the CLI's errors,
and the pytest plugin's option names beside labgrid's and pytest-embedded's."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deploykit.cli import main
from deploykit.readers.boards import load_board
from deploykit.run.farm.exporter_config import exporter_config
from deploykit.run.farm.place_flash import choose
from deploykit.run.farm.session import FarmError, PlaceInfo, PlaceQuery, PlaceResource
from deploykit.run.flashers import FlashError
from deploykit.util.errors import ConfigError, ExitCode


def test_place_query_is_a_name_or_tags():
    assert PlaceQuery.parse("lab/pico2-3") == PlaceQuery(name="lab/pico2-3")
    q = PlaceQuery.parse("board=pico2, lab=b")
    assert q.tags == {"board": "pico2", "lab": "b"}
    assert q.matches(PlaceInfo("x", {"board": "pico2", "lab": "b", "dk_result": "ok"}, None))
    assert not q.matches(PlaceInfo("x", {"board": "pico2"}, None))
    assert PlaceQuery.parse("p").matches(PlaceInfo("lab/p9", {}, None, aliases=("p",)))
    for bad in ("", "board=", "board=pico2,x"):
        with pytest.raises(FarmError):
            PlaceQuery.parse(bad)


def _res(cls, avail=True, name=None, **params):
    return PlaceResource(name or cls, cls, {"host": "exp1", **params}, avail)


def test_the_board_files_flasher_order_decides_among_a_places_resources():
    pico2 = load_board("pico2")
    drive = _res("NetworkUSBMassStorage", path="/dev/sda")
    boot = _res("NetworkUSBFlashableDevice", busnum=1, devnum=7)
    probe = _res("NetworkUSBDebugger", path="1-1.2")
    serial = _res("NetworkSerialPort", port=5000)
    # picotool first, as on a local machine; then the drive; then SWD.
    assert choose(pico2, [serial, drive, boot, probe], "p")[0]["kind"] == "picotool"
    assert choose(pico2, [serial, drive, probe], "p")[0]["kind"] == "uf2-drive"
    # A boot device the exporter does not see now (the board is running) is passed over.
    unseen = _res("NetworkUSBFlashableDevice", avail=False, busnum=1, devnum=7)
    config, res = choose(pico2, [serial, unseen, probe], "p")
    assert (config["kind"], res) == ("openocd", probe)
    with pytest.raises(FlashError, match="not present on the exporter now") as err:
        choose(pico2, [serial, unseen], "p")
    assert "NetworkSerialPort" in err.value.cause
    with pytest.raises(FlashError, match="2 NetworkUSBMassStorage"):
        choose(pico2, [drive, _res("NetworkUSBMassStorage", name="other", path="/dev/sdb")], "p")


def test_exporter_config_comes_from_the_board_file():
    board = load_board("pico2")
    usb = board.raw["usb"]
    cfg = exporter_config(board, "E6614104031B2C2A", group="lab-pico2-3", probe="E6633861A3819D38")
    doc = yaml.safe_load(cfg.text)
    res = doc["lab-pico2-3"]
    assert res["USBSerialPort"]["match"] == {
        "ID_VENDOR_ID": f"{usb['vid']:04x}",
        "ID_MODEL_ID": f"{usb['pid_cdc']:04x}",
        "ID_SERIAL_SHORT": "E6614104031B2C2A",
    }
    assert res["USBSerialPort"]["speed"] == board.raw["serial"]["baud"]
    for cls in ("USBMassStorage", "USBFlashableDevice"):
        assert res[cls]["match"]["ID_MODEL_ID"] == f"{usb['pid_bootsel']:04x}"
    swd = next(c for c in board.raw["flashers"] if c["kind"] == "openocd")
    assert res["USBDebugger"]["match"] == {
        "ID_VENDOR_ID": f"{swd['probe_vid']:04x}",
        "ID_MODEL_ID": f"{swd['probe_pid']:04x}",
        "ID_SERIAL_SHORT": "E6633861A3819D38",
    }
    assert "labgrid-client -p lab-pico2-3 set-tags board=pico2" in cfg.text
    with pytest.raises(ConfigError, match="not a USB serial number"):
        exporter_config(board, "a b")


def test_a_console_on_the_debug_probe_is_matched_by_the_probes_serial():
    board = load_board("pico2-uart")
    with pytest.raises(ConfigError, match="debug probe's serial port"):
        exporter_config(board, "E661")
    res = yaml.safe_load(exporter_config(board, "E661", group="g", probe="PROBE1").text)["g"]
    assert res["USBSerialPort"]["match"]["ID_SERIAL_SHORT"] == "PROBE1"
    assert res["USBSerialPort"]["match"]["ID_MODEL_ID"] == f"{board.raw['usb']['pid_cdc']:04x}"
    assert res["USBMassStorage"]["match"]["ID_SERIAL_SHORT"] == "E661"  # the board's own
    assert res["USBDebugger"]["match"]["ID_SERIAL_SHORT"] == "PROBE1"


@pytest.mark.skipif(
    importlib.util.find_spec("labgrid") is None,
    reason="labgrid is not installed (pip install 'deploykit[farm]')",
)
def test_labgrid_reads_the_exporter_config(tmp_path):
    from labgrid.remote.config import ResourceConfig

    path = tmp_path / "exporter.yaml"
    path.write_text(exporter_config(load_board("pico2"), "E661", group="g").text)
    groups = ResourceConfig(str(path)).data
    assert set(groups["g"]) == {"USBSerialPort", "USBMassStorage", "USBFlashableDevice"}


def test_farm_cli_writes_the_config_and_names_a_missing_coordinator(tmp_path, monkeypatch, capsys):
    out = tmp_path / "exp" / "pico2.yaml"
    assert (
        main(["farm", "exporter-config", "--board", "pico2", "--serial", "E661", "--out", str(out)])
        == 0
    )
    assert "pico2-e661:" in out.read_text()
    monkeypatch.delenv("LG_COORDINATOR", raising=False)
    code = main(["farm", "status"])
    err = capsys.readouterr().err
    assert code == ExitCode.ENVIRONMENT
    assert "deploykit: error:" in err and "Traceback" not in err
    if importlib.util.find_spec("labgrid") is not None:
        # labgrid is there: what is missing is the coordinator
        assert "No labgrid coordinator given" in err and "LG_COORDINATOR" in err
    else:
        # the farm extra is not installed: checked before anything else, and named
        assert "Running on a labgrid board farm needs labgrid" in err
        assert "deploykit[farm]" in err


def test_place_with_a_local_port_is_refused_before_anything_is_built(capsys):
    code = main(
        [
            "run",
            "--board",
            "pico2",
            "--model",
            "mlp_mnist",
            "--place",
            "p",
            "--port",
            "/dev/ttyACM0",
        ]
    )
    assert code == ExitCode.CONFIG
    assert "--place chooses the board on a labgrid farm" in capsys.readouterr().err
    assert (
        main(["flash", "--board", "pico2", "--image", "x.uf2", "--place", "p"]) == ExitCode.CONFIG
    )
    assert (
        main(["run", "--board", "qemu-an547", "--model", "tiny_cnn", "--place", "p"])
        == ExitCode.CONFIG
    )  # QEMU's runner takes no --place


@pytest.mark.skipif(
    importlib.util.find_spec("labgrid") is None
    or importlib.util.find_spec("pytest_embedded") is None,
    reason="needs labgrid and pytest-embedded importable, to add their pytest "
    "options beside deploykit's",
)
def test_pytest_options_do_not_clash_with_labgrid_or_pytest_embedded():
    """argparse refuses an option added twice; all three plugins add theirs to one parser.
    (deploykit's --port did clash with pytest-embedded's; it is --dk-port now.)"""
    from _pytest.config.argparsing import Parser
    from labgrid.pytestplugin import fixtures as labgrid_plugin
    from pytest_embedded import plugin as embedded_plugin

    from deploykit import pytest_plugin

    parser = Parser()
    for plugin in (embedded_plugin, labgrid_plugin, pytest_plugin):
        plugin.pytest_addoption(parser)
    options = {o for group in parser._groups for opt in group.options for o in opt.names()}
    assert {
        "--board",
        "--dk-port",
        "--lg-place",
        "--lg-env",
        "--lg-coordinator",
        "--port",
        "--target",
    } <= options
    parser.parse(["--board", "pico2", "--lg-place", "board=pico2", "--port", "/dev/x"])


def _main_without_labgrid(*args: str) -> subprocess.CompletedProcess:
    """deploykit's CLI in a process of its own where labgrid cannot be imported (None in
    sys.modules is how Python marks a module that must not be imported): the missing-extra
    paths run on every machine, whether it has labgrid or not."""
    code = ("import sys; sys.modules['labgrid'] = None\n"
            f"from deploykit.cli import main\nsys.exit(main({list(args)!r}))")
    env = {k: v for k, v in os.environ.items() if k != "LG_COORDINATOR"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "tools")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_without_labgrid_place_names_the_extra_before_the_build():
    res = _main_without_labgrid("run", "--board", "pico2", "--model", "mlp_mnist", "--place",
                                "board=pico2")
    assert res.returncode == ExitCode.ENVIRONMENT, res.stderr
    assert "deploykit[farm]" in res.stderr and "exporting" not in res.stderr


def test_farm_status_without_labgrid_names_the_extra():
    """The other branch of test_farm_cli_writes_the_config_and_names_a_missing_coordinator."""
    res = _main_without_labgrid("farm", "status")
    assert res.returncode == ExitCode.ENVIRONMENT, res.stderr
    assert "Running on a labgrid board farm needs labgrid" in res.stderr
    assert "deploykit[farm]" in res.stderr and "Traceback" not in res.stderr
