"""Model loading: a bundled model name (`models/<name>.py`) or a path to the user's own file.

A model file is plain Python (it need not be in a package) that defines:

- `model() -> torch.nn.Module`: the network with deterministic weights;
- `example_inputs() -> tuple[torch.Tensor, ...]`: real, deterministic inputs; the export is
  specialised to their shapes and dtypes, and they are the inputs the device is checked on;
- optionally `calibration_inputs() -> list[tuple[torch.Tensor, ...]]` (int8 calibration;
  defaults to `[example_inputs()]`);
- optionally `TOLERANCE = {"<flow>": {"atol": float, "rtol": float}, ...}`.

Everything that can go wrong with such a file becomes a `ConfigError` that names the file,
the problem and the fix. torch is imported only when a model is actually loaded.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from deploykit.flows import flow_names
from deploykit.util.errors import ConfigError

MODELS_DIR = "models"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class ModelSpec:
    """A loaded, validated model. `module` is in eval mode."""

    name: str
    module: Any  # torch.nn.Module (typed loosely so this file imports without torch)
    example_inputs: tuple[Any, ...]  # tuple[torch.Tensor, ...]
    calibration_inputs: list[tuple[Any, ...]]  # never empty; [example_inputs] by default
    tolerance: dict[str, dict[str, float]]  # flow -> {"atol": .., "rtol": ..}; may be empty
    source_path: Path
    description: str = ""  # first line of the model file's docstring
    has_calibration_inputs: bool = False  # False when calibration defaulted to example_inputs

    def tolerance_for(self, flow: str) -> dict[str, float]:
        """The model's tolerance for `flow`, or {} if it sets none."""
        return dict(self.tolerance.get(flow, {}))


def models_dir(repo_root: Path) -> Path:
    return Path(repo_root) / MODELS_DIR


def model_dirs(repo_root: Path) -> list[Path]:
    """Where a model name is looked up, first match wins: --models-dir, ./models, then the
    bundled models of `repo_root` (paths.search_dirs)."""
    from deploykit.util.paths import search_dirs

    dirs = [d.path for d in search_dirs("models") if d.origin != "bundled"]
    bundled = models_dir(repo_root)
    return [*(d for d in dirs if d != bundled.resolve()), bundled]


def model_files(repo_root: Path) -> dict[str, Path]:
    """Every model name on the search path -> its file (files starting with `_` left out)."""
    found: dict[str, Path] = {}
    for d in model_dirs(repo_root):
        if d.is_dir():
            for p in sorted(d.glob("*.py")):
                if not p.name.startswith("_"):
                    found.setdefault(p.stem, p)
    return found


def list_models(repo_root: Path) -> list[str]:
    """Names of the models on the search path (`models/*.py`, leaving out `_*.py`)."""
    return sorted(model_files(repo_root))


def describe_model(path: Path) -> str:
    """First docstring line of a model file, read without importing it (cheap, no torch)."""
    try:
        doc = ast.get_docstring(ast.parse(Path(path).read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError):
        return ""
    return doc.strip().splitlines()[0] if doc else ""


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".py") or "/" in name_or_path or "\\" in name_or_path


def resolve_model_path(name_or_path: str, repo_root: Path) -> tuple[str, Path]:
    """Map a model name or file path to (name, absolute path); ConfigError if there is none."""
    if not name_or_path or not name_or_path.strip():
        raise ConfigError("No model given.",
                          f"Name a bundled model ({_available_text(repo_root)}) "
                          "or give the path of a Python model file.")
    if _looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_absolute():
            path = Path.cwd() / path
        if not path.exists():
            raise ConfigError(f"Model file {name_or_path} does not exist.",
                              "Check the path, or use a bundled model name: "
                              f"{_available_text(repo_root)}.")
        if not path.is_file():
            raise ConfigError(f"Model path {name_or_path} is not a file.",
                              "Give the path of a .py file that defines model() and "
                              "example_inputs().")
        if path.suffix != ".py":
            raise ConfigError(f"Model file {name_or_path} is not a Python (.py) file.",
                              "A model is a .py file that defines model() and "
                              "example_inputs().")
        return path.stem, path.resolve()
    if not _NAME_RE.match(name_or_path):
        raise ConfigError(f"'{name_or_path}' is not a valid model name.",
                          f"Use one of: {_available_text(repo_root)}, or a path ending in .py.")
    path = model_files(repo_root).get(name_or_path)
    if path is None:
        raise ConfigError(f"Unknown model '{name_or_path}'.",
                          f"Available models: {_available_text(repo_root)}. "
                          "Or pass the path of your own model file (e.g. ./my_model.py).")
    return name_or_path, path.resolve()


def _available_text(repo_root: Path) -> str:
    names = list_models(repo_root)
    return ", ".join(names) if names else f"(none found in {models_dir(repo_root)})"


def import_python_file(path: Path, kind: str = "model") -> ModuleType:
    """Import a .py file by path, under a private module name, without needing a package.
    `kind` names the file in errors and in the module's name (a model, a data set)."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    mod_name = f"_deploykit_{kind.replace(' ', '_')}_{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"Cannot load {path} as a Python module.",
                          "Check that it is a readable .py file.")
    module = importlib.util.module_from_spec(spec)
    # Registered while executing so dataclasses/pickle inside the file can find it; the file's
    # directory goes on sys.path for that time so it can import helpers beside it.
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        sys.modules.pop(mod_name, None)
        raise ConfigError(f"{kind.capitalize()} file {path} has a syntax error: {e.msg} "
                          f"(line {e.lineno}).", f"Fix the Python syntax in the {kind} file.") \
            from e
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise ConfigError(f"Importing {kind} file {path} raised {type(e).__name__}: {e}",
                          f"Fix the {kind} file; run `python <file>` to see the full "
                          "traceback.") from e
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    return module


def _call(path: Path, module: ModuleType, fn_name: str) -> Any:
    fn = getattr(module, fn_name)
    if not callable(fn):
        raise ConfigError(f"{path}: `{fn_name}` is not a function.",
                          f"Define `def {fn_name}():` in the model file.")
    try:
        return fn()
    except Exception as e:
        raise ConfigError(f"{path}: {fn_name}() raised {type(e).__name__}: {e}",
                          f"Fix {fn_name}() in the model file; call it in Python to see "
                          "the full traceback.") from e


def _check_tensor_tuple(path: Path, what: str, value: Any) -> tuple[Any, ...]:
    import torch

    if isinstance(value, torch.Tensor):
        raise ConfigError(f"{path}: {what} returned a single tensor, not a tuple of tensors.",
                          "Return a tuple, e.g. `return (x,)`.")
    if not isinstance(value, (tuple, list)):
        raise ConfigError(f"{path}: {what} returned {type(value).__name__}, "
                          "not a tuple of tensors.",
                          "Return a tuple of torch.Tensor, e.g. `return (x,)`.")
    if len(value) == 0:
        raise ConfigError(f"{path}: {what} returned an empty tuple.",
                          "The model needs at least one input tensor.")
    for i, t in enumerate(value):
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"{path}: {what} item {i} is {type(t).__name__}, "
                              "not a torch.Tensor.",
                              "Only tensor inputs are supported; bake other arguments "
                              "into the module.")
        if t.is_sparse or t.is_quantized or t.is_complex():
            raise ConfigError(f"{path}: {what} item {i} is a sparse, quantized or complex "
                              "tensor.", "Use dense real tensors (float32 for images/audio).")
    return tuple(value)


def _check_tolerance(path: Path, value: Any) -> dict[str, dict[str, float]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: TOLERANCE must be a dict, got {type(value).__name__}.",
                          'Write e.g. TOLERANCE = {"cortex_m_int8": {"atol": 0.05}}.')
    out: dict[str, dict[str, float]] = {}
    for flow, tol in value.items():
        if flow not in flow_names():
            raise ConfigError(f"{path}: TOLERANCE names unknown flow '{flow}'.",
                              f"Known flows: {', '.join(flow_names())}.")
        if not isinstance(tol, dict) or not tol:
            raise ConfigError(f"{path}: TOLERANCE['{flow}'] must be a non-empty dict.",
                              'Write e.g. {"atol": 0.05} or {"atol": 1e-5, "rtol": 0}.')
        entry: dict[str, float] = {}
        for key, v in tol.items():
            if key not in ("atol", "rtol"):
                raise ConfigError(f"{path}: TOLERANCE['{flow}'] has unknown key '{key}'.",
                                  "Use only 'atol' and 'rtol'.")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(f"{path}: TOLERANCE['{flow}']['{key}'] must be a "
                                  f"non-negative number, got {v!r}.",
                                  "Use a float such as 1e-5.")
            entry[key] = float(v)
        out[flow] = entry
    return out


def load_model(name_or_path: str, repo_root: Path) -> ModelSpec:
    """Load and validate a model by bundled name or file path.

    Runs `model()`, `example_inputs()`, `calibration_inputs()` (if defined) and one forward
    pass on the example inputs, so a broken model fails here with a clear ConfigError rather
    than deep inside torch.export.
    """
    name, path = resolve_model_path(name_or_path, Path(repo_root))
    module = import_python_file(path)

    missing = [fn for fn in ("model", "example_inputs") if not hasattr(module, fn)]
    if missing:
        raise ConfigError(f"{path} does not define {' or '.join(f'{m}()' for m in missing)}.",
                          "A model file needs `def model() -> torch.nn.Module` and "
                          "`def example_inputs() -> tuple[torch.Tensor, ...]`.")

    import torch

    net = _call(path, module, "model")
    if not isinstance(net, torch.nn.Module):
        raise ConfigError(f"{path}: model() returned {type(net).__name__}, "
                          "not a torch.nn.Module.",
                          "Return the network instance, e.g. `return MyNet().eval()`.")
    net.eval()

    inputs = _check_tensor_tuple(path, "example_inputs()", _call(path, module, "example_inputs"))

    has_calib = hasattr(module, "calibration_inputs")
    if has_calib:
        calib_raw = _call(path, module, "calibration_inputs")
        if not isinstance(calib_raw, (list, tuple)) or len(calib_raw) == 0:
            raise ConfigError(f"{path}: calibration_inputs() must return a non-empty list of "
                              "input tuples.",
                              "Return e.g. `[example_inputs(), (other_x,)]`.")
        calib = []
        for i, sample in enumerate(calib_raw):
            sample = _check_tensor_tuple(path, f"calibration_inputs()[{i}]", sample)
            shapes = [tuple(t.shape) for t in sample]
            want = [tuple(t.shape) for t in inputs]
            if shapes != want or [t.dtype for t in sample] != [t.dtype for t in inputs]:
                raise ConfigError(
                    f"{path}: calibration_inputs()[{i}] has shapes/dtypes "
                    f"{_sig(sample)}, but example_inputs() has {_sig(inputs)}.",
                    "Every calibration sample must match example_inputs() exactly "
                    "(the export is specialised to those shapes).")
            calib.append(sample)
    else:
        calib = [inputs]

    tolerance = _check_tolerance(path, getattr(module, "TOLERANCE", {}))

    try:
        with torch.no_grad():
            out = net(*[t.clone() for t in inputs])
    except Exception as e:
        raise ConfigError(f"{path}: model()(*example_inputs()) raised "
                          f"{type(e).__name__}: {e}",
                          "Make example_inputs() match what forward() expects "
                          "(shapes, dtypes, number of arguments).") from e
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise ConfigError(f"{path}: forward() must return a tensor or a tuple of tensors, "
                          f"got {type(out).__name__}.",
                          "Return tensors only (no dicts, None or Python numbers).")

    return ModelSpec(
        name=name,
        module=net,
        example_inputs=inputs,
        calibration_inputs=calib,
        tolerance=tolerance,
        source_path=path,
        description=describe_model(path),
        has_calibration_inputs=has_calib,
    )


def _sig(tensors: tuple[Any, ...]) -> str:
    return ", ".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}" for t in tensors)
