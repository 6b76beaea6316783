"""Loading extension points (flows, board families) by `module:attribute` name.

The built-in implementations and those of other installed packages (Python entry points, the
mechanism pytest and west use for their plugins) are loaded the same way: a table of
`name -> "package.module:Class"`. A class is instantiated once; its `name` must be the
entry point's name. A broken plugin is a ConfigError that names the package and the fix, not
a traceback in the middle of an unrelated command.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any, TypeVar

from deploykit.util.errors import ConfigError

T = TypeVar("T")


def _load(spec: str, where: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Cannot load {where} '{spec}': {type(exc).__name__}: {exc}",
                          "Reinstall or uninstall the package that provides it.") from exc
    return obj


def load_plugins(group: str, builtins: dict[str, str], base: type[T], what: str
                 ) -> dict[str, T]:
    """{name: instance} of the built-in `builtins` and the entry points of `group`, each a
    subclass of `base` (or an instance of one) whose `name` matches."""
    specs = [(name, spec, "deploykit") for name, spec in builtins.items()]
    for ep in metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist is not None else "an installed package"
        specs.append((ep.name, ep.value, dist))
    out: dict[str, T] = {}
    for name, spec, dist in specs:
        where = f"{what} '{name}' of {dist}"
        obj = _load(spec, where)
        instance = obj() if isinstance(obj, type) and issubclass(obj, base) else obj
        if not isinstance(instance, base):
            raise ConfigError(f"The {where} ('{spec}') is not a {base.__module__}."
                              f"{base.__name__}.", f"Make it a subclass of {base.__name__}.")
        if getattr(instance, "name", None) != name:
            raise ConfigError(f"The {where} ('{spec}') calls itself "
                              f"'{getattr(instance, 'name', None)}'.",
                              "The entry point's name and the class's `name` must agree.")
        if name in out:
            raise ConfigError(f"Two {what}s are named '{name}' (one of them from {dist}).",
                              f"Uninstall one of them, or rename the {what}.")
        out[name] = instance
    return out
