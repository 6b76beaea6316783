"""Turn results (dataclasses, paths, numpy arrays) into JSON-ready values for --json output."""

from __future__ import annotations

import dataclasses
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
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and value != value:
        return None
    return value
