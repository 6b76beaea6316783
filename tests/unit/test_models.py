"""Model loading: bundled models, user model files, and the ConfigErrors for broken ones."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from deploykit.program.models import list_models, load_model, resolve_model_path
from deploykit.util.errors import ConfigError, ExitCode

REPO = Path(__file__).resolve().parents[2]

# Bundled model -> the shape of its output.
OUTPUT_SHAPES = {"mlp_mnist": (1, 10), "tiny_cnn": (1, 10), "gru_kws": (1, 12),
                 "transformer_block": (1, 16, 32), "mobilenet_v3_block": (1, 16, 12, 12)}
BUNDLED = list(OUTPUT_SHAPES)


def write_model(tmp_path: Path, body: str, name: str = "user_model.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


GOOD = textwrap.dedent("""
    import torch

    def model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 2)

    def example_inputs():
        return (torch.arange(4, dtype=torch.float32).reshape(1, 4) / 4,)
""")


def test_list_models_has_bundled():
    names = list_models(REPO)
    for n in BUNDLED:
        assert n in names


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_model_loads_and_is_deterministic(name):
    a = load_model(name, REPO)
    b = load_model(name, REPO)
    assert a.name == name
    assert a.source_path == REPO / "models" / f"{name}.py"
    assert a.description  # docstring first line
    assert isinstance(a.module, torch.nn.Module) and not a.module.training
    assert a.has_calibration_inputs and len(a.calibration_inputs) >= 2
    for x, y in zip(a.example_inputs, b.example_inputs, strict=True):
        assert torch.equal(x, y)
        assert x.dtype == torch.float32
        # real data: not constant, not all ones
        assert x.std() > 0.1 and not torch.all(x == 1)
    for (pa, ta), (pb, tb) in zip(a.module.state_dict().items(), b.module.state_dict().items(),
                                  strict=True):
        assert pa == pb and torch.equal(ta, tb)
    with torch.no_grad():
        out = a.module(*a.example_inputs)
    assert out.shape == OUTPUT_SHAPES[name] and torch.isfinite(out).all()
    for flow in ("portable_fp32", "cortex_m_int8"):
        assert a.tolerance_for(flow)["atol"] > 0


def test_example_inputs_shapes():
    assert load_model("mlp_mnist", REPO).example_inputs[0].shape == (1, 784)
    assert load_model("tiny_cnn", REPO).example_inputs[0].shape == (1, 3, 8, 8)


def test_user_model_by_path_with_sibling_import(tmp_path):
    (tmp_path / "helper_layers.py").write_text("import torch\nWIDTH = 4\n")
    path = write_model(tmp_path, """
        import torch
        from helper_layers import WIDTH

        def model():
            torch.manual_seed(1)
            return torch.nn.Sequential(torch.nn.Linear(WIDTH, 3), torch.nn.ReLU())

        def example_inputs():
            return (torch.linspace(-1, 1, WIDTH).reshape(1, WIDTH),)
    """)
    spec = load_model(str(path), REPO)
    assert spec.name == "user_model" and spec.source_path == path.resolve()
    assert spec.calibration_inputs == [spec.example_inputs]
    assert not spec.has_calibration_inputs and spec.tolerance == {}


def test_unknown_name_lists_available():
    with pytest.raises(ConfigError) as e:
        load_model("no_such_model", REPO)
    msg = str(e.value)
    assert "Unknown model 'no_such_model'" in msg
    for n in BUNDLED:
        assert n in msg
    assert e.value.exit_code == ExitCode.CONFIG


def test_invalid_name():
    with pytest.raises(ConfigError, match="not a valid model name"):
        resolve_model_path("bad-name!", REPO)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(str(tmp_path / "nope.py"), REPO)


def test_not_a_python_file(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"not a Python \(\.py\) file"):
        load_model(str(p), REPO)


def test_missing_entry_points(tmp_path):
    path = write_model(tmp_path, "import torch\nX = 1\n")
    with pytest.raises(ConfigError) as e:
        load_model(str(path), REPO)
    assert "does not define model() or example_inputs()" in str(e.value)
    assert "def model() -> torch.nn.Module" in str(e.value)


def test_missing_example_inputs_only(tmp_path):
    path = write_model(tmp_path, "import torch\ndef model():\n    return torch.nn.ReLU()\n")
    with pytest.raises(ConfigError, match=r"does not define example_inputs\(\)"):
        load_model(str(path), REPO)


def test_syntax_error(tmp_path):
    path = write_model(tmp_path, "def model(:\n    pass\n")
    with pytest.raises(ConfigError, match="syntax error"):
        load_model(str(path), REPO)


def test_import_error(tmp_path):
    path = write_model(tmp_path, "import no_such_package_xyz\n")
    with pytest.raises(ConfigError, match="ModuleNotFoundError"):
        load_model(str(path), REPO)


def test_entry_point_raises(tmp_path):
    path = write_model(tmp_path, GOOD + "\ndef calibration_inputs():\n"
                       "    raise RuntimeError('dataset not found')\n")
    with pytest.raises(ConfigError) as e:
        load_model(str(path), REPO)
    assert "calibration_inputs() raised RuntimeError: dataset not found" in str(e.value)


def test_model_returns_wrong_type(tmp_path):
    path = write_model(tmp_path, GOOD.replace("return torch.nn.Linear(4, 2)", "return 42"))
    with pytest.raises(ConfigError, match=r"model\(\) returned int, not a torch.nn.Module"):
        load_model(str(path), REPO)


def test_example_inputs_bare_tensor(tmp_path):
    path = write_model(tmp_path, GOOD.replace("return (torch.arange(4, dtype=torch.float32)"
                                              ".reshape(1, 4) / 4,)",
                                              "return torch.ones(1, 4) * 0.5"))
    with pytest.raises(ConfigError) as e:
        load_model(str(path), REPO)
    assert "single tensor" in str(e.value) and "return (x,)" in str(e.value)


def test_example_inputs_non_tensor_item(tmp_path):
    path = write_model(tmp_path, GOOD.replace("return (torch.arange(4, dtype=torch.float32)"
                                              ".reshape(1, 4) / 4,)", "return ([1, 2, 3, 4],)"))
    with pytest.raises(ConfigError, match="item 0 is list, not a torch.Tensor"):
        load_model(str(path), REPO)


def test_calibration_shape_mismatch(tmp_path):
    path = write_model(tmp_path, GOOD + "\ndef calibration_inputs():\n"
                       "    return [(torch.zeros(2, 4),)]\n")
    with pytest.raises(ConfigError, match="must match example_inputs"):
        load_model(str(path), REPO)


def test_forward_fails_on_example_inputs(tmp_path):
    path = write_model(tmp_path, GOOD.replace(".reshape(1, 4) / 4,)", ".reshape(2, 2),)"))
    with pytest.raises(ConfigError) as e:
        load_model(str(path), REPO)
    assert "model()(*example_inputs()) raised RuntimeError" in str(e.value)


def test_bad_tolerance(tmp_path):
    path = write_model(tmp_path, GOOD + '\nTOLERANCE = {"int4": {"atol": 1}}\n')
    with pytest.raises(ConfigError, match="unknown flow 'int4'"):
        load_model(str(path), REPO)
    path = write_model(tmp_path, GOOD + '\nTOLERANCE = {"cortex_m_int8": {"atol": -1}}\n')
    with pytest.raises(ConfigError, match="non-negative number"):
        load_model(str(path), REPO)


def test_importing_export_is_cheap():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import deploykit.program.export, "
            "deploykit.program.models; print(sorted(m for m in ('torch', 'executorch', 'numpy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "tools")], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == "[]"


# The MLPerf Tiny v1 reference models: input shape, output shape, MACs of the published
# architectures (convolutions and linears; FlopCounterMode counts 2 flops per MAC).
MLPERF_TINY = {
    "ds_cnn": ((1, 1, 49, 10), (1, 12), 2_656_768),
    "mobilenet_v1_025": ((1, 3, 96, 96), (1, 2), 7_489_664),
    "resnet8": ((1, 3, 32, 32), (1, 10), 12_501_632),
    "deep_autoencoder": ((1, 640), (1, 640), 264_192),
}


@pytest.mark.parametrize("name", sorted(MLPERF_TINY))
def test_mlperf_tiny_models(name):
    from torch.utils.flop_counter import FlopCounterMode

    in_shape, out_shape, macs = MLPERF_TINY[name]
    a, b = load_model(name, REPO), load_model(name, REPO)
    assert a.description and a.has_calibration_inputs and len(a.calibration_inputs) >= 4
    x = a.example_inputs[0]
    assert tuple(x.shape) == in_shape and torch.equal(x, b.example_inputs[0])
    # realistic data, not a constant: calibration samples differ from each other
    assert x.std() > 0.1
    assert not torch.equal(a.calibration_inputs[1][0], a.calibration_inputs[2][0])
    for (pa, ta), (pb, tb) in zip(a.module.state_dict().items(), b.module.state_dict().items(),
                                  strict=True):
        assert pa == pb and torch.equal(ta, tb)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        out = a.module(x)
    assert tuple(out.shape) == out_shape and torch.isfinite(out).all()
    assert counter.get_total_flops() == 2 * macs
    # Seeded BatchNorm statistics keep the outputs of a realistic scale (not 0, not huge).
    assert 1e-3 < float(out.abs().max()) < 1e3
    for flow in ("portable_fp32", "cortex_m_int8", "ethos_u_int8"):
        assert a.tolerance_for(flow)["atol"] > 0


def test_mlperf_tiny_checkpoint_loads_through_model(tmp_path, monkeypatch):
    """A trained state_dict replaces the seeded weights through model() (the documented way)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("resnet8_ckpt", REPO / "models" / "resnet8.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    trained = module.ResNet8()
    with torch.no_grad():
        for p in trained.parameters():
            p.fill_(0.01)
    path = tmp_path / "resnet8.pt"
    torch.save(trained.state_dict(), path)
    monkeypatch.setattr(module, "CHECKPOINT", str(path))
    loaded = module.model()
    assert all(torch.all(p == 0.01) for p in loaded.parameters())
    assert not loaded.training
