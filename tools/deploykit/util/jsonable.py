"""Turn results (dataclasses, paths, numpy arrays) into JSON-ready values for --json output and
the result files: always valid JSON (non-finite floats become null)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)
               if f.metadata.get("json", True)}
        for name in ("passed", "fits", "flash_total", "ram_total"):
            attr = getattr(type(value), name, None)
            if isinstance(attr, property):
                out[name] = to_jsonable(getattr(value, name))
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "tolist"):  # numpy arrays and scalars, whose floats may be non-finite
        return to_jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or infinity (Python's json writes invalid `NaN`/`Infinity`): null.
        # An infinite error means a missing output, which its entry's `problem` names.
        return None
    return value
