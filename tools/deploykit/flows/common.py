"""What every flow shares: timed, named steps and tensor helpers."""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from deploykit.util.errors import ConfigError, DeployKitError, ExportError

if TYPE_CHECKING:
    import numpy as np

    from deploykit.flows.base import QuantParams


def parse_cpu(cpu: str) -> tuple[str, str | None]:
    """Split a board CPU string into (cortex_m target string, ISA override or None).

    "cortex-m55" -> ("cortex-m55", None); "cortex-m55+nomve" -> ("cortex-m55", "DSP");
    "cortex-m33+nodsp" -> ("cortex-m33", "SCALAR"); "+nofp" etc. are ignored here.
    """
    base, *exts = cpu.strip().lower().split("+")
    if not base.startswith("cortex-m") or len(base) <= len("cortex-m"):
        raise ConfigError(f"CPU '{cpu}' is not a Cortex-M CPU.",
                          "Use a GCC-style name such as cortex-m55, cortex-m33 or "
                          "cortex-m33+nofp.")
    isa = None
    if any(e.startswith("nodsp") for e in exts):
        isa = "SCALAR"
    elif any(e.startswith("nomve") for e in exts):
        isa = "DSP"
    return base, isa


class Stages:
    """Times named steps and turns their exceptions into ExportError naming the step."""

    def __init__(self, flow: str, model: str,
                 on_step: Callable[[str], None] | None = None) -> None:
        self.flow = flow
        self.model = model
        self.timings: dict[str, float] = {}
        self.failed_traceback: str | None = None
        self.on_step = on_step  # told each step's name as it starts (the live status line)

    @contextlib.contextmanager
    def step(self, name: str, hint: str = "") -> Iterator[None]:
        if self.on_step is not None:
            self.on_step(name)
        t0 = time.perf_counter()
        try:
            yield
        except DeployKitError:
            raise
        except Exception as e:
            self.failed_traceback = traceback.format_exc()
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ExportError(
                f"{self.flow} export of '{self.model}' failed in {name}: "
                f"{type(e).__name__}: {msg}",
                hint or "The model may use an operator or pattern this flow does not support; "
                "see the log for the full traceback.") from e
        finally:
            self.timings[name] = round(time.perf_counter() - t0, 3)


def flatten_tensors(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in flatten_tensors(o)]
    raise TypeError(f"model output contains {type(out).__name__}; only tensors are supported")


def to_numpy(t: Any) -> np.ndarray:
    return t.detach().contiguous().cpu().numpy().copy()


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> list[float]:
    import numpy as np

    return [float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
            for x, y in zip(a, b, strict=True)]


def in_steps(diffs: list[float], quant: list[QuantParams | None]) -> list[float | None]:
    return [d / q.scale if q else None for d, q in zip(diffs, quant, strict=True)]


def call_like(graph: Any, like: Any, fake: Any, target: Any, *args: Any,
              keep_out: tuple[str, ...] = (), **kwargs: Any) -> Any:
    """A new call_function node of the float graph (the rewrites before quantization) with
    `like`'s metadata (stack trace, module stack: the model line the reports and mixed
    precision name) but for its fake value and `keep_out`, and its own fake value, computed in
    the fake mode `fake`."""
    import torch

    node = graph.call_function(target, args, kwargs)
    node.meta.update({k: v for k, v in like.meta.items() if k != "val" and k not in keep_out})

    def val(a: Any) -> Any:
        return a.meta["val"] if isinstance(a, torch.fx.Node) else a

    vals = torch.utils._pytree.tree_map(val, (args, kwargs))
    with fake:
        node.meta["val"] = target(*vals[0], **vals[1])
    return node
