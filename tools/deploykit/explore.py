"""`deploykit explore model.pte`: the `.pte` in Google's Model Explorer, through Arm's PTE adapter.

Both are an optional extra (`pip install "deploykit[explore]"`: `ai-edge-model-explorer` and
`pte-adapter-model-explorer`), imported only here. Model Explorer serves a local web UI and
opens it in the browser; the adapter turns the ExecuTorch program (and its delegates) into
Model Explorer's graph format.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from pathlib import Path

from .errors import ConfigError, EnvironmentProblem

EXTRA = "explore"
PACKAGES = {  # import name -> PyPI distribution
    "model_explorer": "ai-edge-model-explorer",
    "pte_adapter_model_explorer": "pte-adapter-model-explorer",
}
ADAPTER = "pte_adapter_model_explorer"


def missing_packages() -> list[str]:
    """The PyPI names of the explore extra's packages that cannot be imported here."""
    return [dist for module, dist in PACKAGES.items()
            if importlib.util.find_spec(module) is None]


def explore(pte: Path, port: int | None = None, open_browser: bool = True) -> None:
    """Serve Model Explorer with the PTE adapter on `pte` (blocks until interrupted)."""
    pte = Path(pte)
    if not pte.is_file():
        raise ConfigError(f"No .pte file at {pte}.", "Run `deploykit export` first.")
    missing = missing_packages()
    if missing:
        raise EnvironmentProblem(
            f"Model Explorer is not installed: {', '.join(missing)} missing.",
            f'Install the optional extra: pip install "deploykit[{EXTRA}]" (from this '
            f"checkout: pip install -e \".[{EXTRA}]\"), or pip install {' '.join(missing)}.")
    model_explorer = importlib.import_module("model_explorer")
    wanted = {"extensions": [ADAPTER], "port": port,
              "no_open_in_browser": not open_browser}
    accepted = inspect.signature(model_explorer.visualize).parameters
    kwargs = {k: v for k, v in wanted.items() if k in accepted and v is not None}
    model_explorer.visualize(str(pte.resolve()), **kwargs)
