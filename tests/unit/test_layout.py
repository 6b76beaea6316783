"""The package's shape (docs/architecture.md): a few entry points at the root, one folder per
stage or layer, each with a docstring, imports between folders pointing only down the layers,
no stage importing the CLI or the API, and one resolution of the target per command."""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.unit.test_import_graph import PACKAGE_DIR, import_graph

# The layers, lowest first: a module may import from its own folder and the folders before it.
LAYERS = ("util", "readers", "flows", "program", "memory", "build", "families", "run",
          "pipeline", "profiling")
ENTRY_POINTS = {"__init__.py", "__main__.py", "api.py", "cli.py", "pytest_plugin.py"}


def _folder(module: str) -> str | None:
    """The layer folder of a dotted module name (None: the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_the_root_holds_the_entry_points_and_the_layer_folders():
    entries = {p.name for p in PACKAGE_DIR.iterdir() if p.name != "__pycache__"}
    assert entries == ENTRY_POINTS | set(LAYERS), (
        "a new module belongs in one of the folders (docs/architecture.md)")
    assert len(entries) <= 15


@pytest.mark.parametrize("folder", sorted({p.parent for p in PACKAGE_DIR.rglob("*.py")}
                                          - {PACKAGE_DIR}), ids=lambda p: p.name)
def test_every_folder_says_what_it_holds(folder: Path):
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder} has no __init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc and len(doc) > 40, f"{init} has no docstring saying what the folder holds"


def test_imports_between_folders_point_down_the_layers():
    upward = []
    for edge in import_graph(PACKAGE_DIR):
        source, target = _folder(edge.source), _folder(edge.target)
        if source is None or target is None or source == target:
            continue
        if LAYERS.index(target) > LAYERS.index(source):
            upward.append(f"{edge.source} -> {edge.target} ({edge.where})")
    assert not upward, "imports up the layers (LAYERS, lowest first):\n" + "\n".join(upward)


def test_no_stage_imports_the_cli_the_api_or_the_plugin():
    top = {"deploykit.cli", "deploykit.api", "deploykit.pytest_plugin", "deploykit"}
    found = [f"{e.source} -> {e.target} ({e.where})" for e in import_graph(PACKAGE_DIR)
             if _folder(e.source) is not None and e.target in top]
    assert not found, "\n".join(found)


# ---- the target is resolved once per command ------------------------------------------------

RESOLVERS = {
    "family": ("deploykit.families", "family_of"),
    "flow": ("deploykit.flows", "get_flow"),
    "profile": ("deploykit.pipeline.profiles", "resolve_profile"),
    "npu": ("deploykit.readers.npu", "npu_config"),
    "runner": ("deploykit.run.runners", "runner_class"),
}


@contextmanager
def counted_resolvers() -> Iterator[Counter]:
    """Count every call of the resolvers, however a module imported them: each module of the
    package that holds one of the functions gets a counting wrapper in its place."""
    import importlib

    for module in ("deploykit.api", "deploykit.pipeline.chains", "deploykit.pipeline.target",
                   "deploykit.memory.fit", "deploykit.run.proxy", "deploykit.build.render",
                   "deploykit.memory.plan", "deploykit.program.export"):
        importlib.import_module(module)
    calls: Counter = Counter()
    originals = {key: getattr(importlib.import_module(mod), name)
                 for key, (mod, name) in RESOLVERS.items()}
    patched: list[tuple[object, str, Callable]] = []

    def counting(key: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)
        return wrapper

    wrappers = {key: counting(key, fn) for key, fn in originals.items()}
    for module in [m for name, m in sys.modules.items() if name.startswith("deploykit")]:
        for attr, value in list(vars(module).items()):
            for key, fn in originals.items():
                if value is fn:
                    patched.append((module, attr, value))
                    setattr(module, attr, wrappers[key])
    try:
        yield calls
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)


ONCE_EACH = dict.fromkeys(RESOLVERS, 1)


def test_export_and_plan_resolve_the_target_once(tmp_path):
    from deploykit import api

    out = tmp_path / "tiny_cnn"
    with counted_resolvers() as calls:
        api.export("qemu-an547", "tiny_cnn", out=out)
    assert dict(calls) == ONCE_EACH
    with counted_resolvers() as calls:
        api.plan("qemu-an547", "tiny_cnn", out=out)  # the export is reused
    assert dict(calls) == ONCE_EACH
    with counted_resolvers() as calls:
        api.plan("corstone-320", pte=out / "export" / "model.pte", out=tmp_path / "c320",
                 npu_macs=128)
    assert dict(calls) == ONCE_EACH


def test_a_target_carries_what_the_stages_ask_for():
    from deploykit.pipeline.target import resolve_target
    from deploykit.util.errors import ConfigError

    t = resolve_target("corstone-320", flow="ethos_u_int8", npu_macs=512,
                       npu_memory_mode="Dedicated_Sram_384KB", profile="speed")
    assert (t.family.name, t.flow.name, t.profile.name, t.runner.kind) == (
        "mps", "ethos_u_int8", "speed", "fvp")
    assert t.npu is not None and t.npu.target == "ethos-u85-512"
    assert t.npu.memory_mode == "Dedicated_Sram_384KB" and t.board.npu is t.npu
    pico = resolve_target("pico2", profile="reference")
    assert pico.board.cpu["float_abi"] == "soft"  # the board as the profile compiles it
    assert pico.proxy is not None and pico.proxy.board.name == "qemu-an505"
    assert pico.proxy.board.cpu["gcc_flags"] == pico.board.cpu["gcc_flags"]
    with pytest.raises(ConfigError, match="does not support the ethos_u_int8 flow"):
        resolve_target("qemu-an547", flow="ethos_u_int8")
    with pytest.raises(ConfigError, match="has no NPU"):
        resolve_target("qemu-an547", npu_macs=256)
    with pytest.raises(ConfigError, match="not an option of the qemu runner"):
        resolve_target("qemu-an547", runner_options={"port": "/dev/ttyACM0"})
