from pathlib import Path

import pytest
import yaml

from deploykit.readers.boards import available_boards, board_from_dict, load_board, parse_size
from deploykit.util.errors import ConfigError


def test_every_board_file_validates():
    names = available_boards()
    assert {"qemu-an547", "qemu-an505"} <= set(names)
    for name in names:
        board = load_board(name)
        for kind, region in board.placement.items():
            assert kind in board.region(region).holds


def test_sizes_parse():
    assert parse_size("512K") == 512 * 1024
    assert parse_size("4M") == 4 << 20
    assert parse_size(100) == 100
    with pytest.raises(ValueError):
        parse_size("12Q")


def test_an547_facts_come_from_the_file():
    board = load_board("qemu-an547")
    assert board.region("itcm").origin == 0x10000000
    assert board.region_for("vectors").name == "itcm"
    assert "-mcpu=cortex-m55" in board.cpu_flags


def _raw(name: str) -> dict:
    return yaml.safe_load((Path(load_board(name).path)).read_text())


def test_unknown_board_lists_the_known_ones():
    with pytest.raises(ConfigError) as exc:
        load_board("no-such-board")
    assert "qemu-an547" in exc.value.hint


def test_schema_violation_names_the_field(tmp_path):
    data = _raw("qemu-an547")
    data["console"]["base"] = "not-a-number"
    with pytest.raises(ConfigError) as exc:
        board_from_dict(data, tmp_path / "qemu-an547.yaml")
    assert "console/base" in exc.value.cause


def test_overlapping_regions_are_refused(tmp_path):
    data = _raw("qemu-an547")
    data["memory"][1]["origin"] = data["memory"][0]["origin"] + 0x1000
    with pytest.raises(ConfigError, match="overlap"):
        board_from_dict(data, tmp_path / "qemu-an547.yaml")


def test_placement_must_be_allowed_by_holds(tmp_path):
    data = _raw("qemu-an547")
    data["placement"]["stack"] = "ddr"
    with pytest.raises(ConfigError, match="holds"):
        board_from_dict(data, tmp_path / "qemu-an547.yaml")


def test_name_must_match_file_name(tmp_path):
    data = _raw("qemu-an505")
    with pytest.raises(ConfigError, match="must match"):
        board_from_dict(data, tmp_path / "other.yaml")
