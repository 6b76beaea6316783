"""The export flows: one module per flow, one registry.

A flow turns a model into a `.pte` for one kind of target (portable kernels, CMSIS-NN on a
Cortex-M, an Ethos-U NPU) and says what the device's outputs are compared with. Everything
that lists flows (the CLI's `--flow` choices, the keys of a model file's `TOLERANCE`, a board
file's `export.allowed`) reads this registry.

Flows of other installed packages join through the `deploykit.flows` entry point group: an
entry point `name = "package.module:FlowClass"` whose class is a `deploykit.flows.base.Flow`
with that `name` (docs/architecture.md, "How to add a flow"). The built-in flows are listed
the same way, as `module:class` strings, and loaded on first use, so importing this package
imports no flow (and no torch).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from deploykit.util.errors import ConfigError
from deploykit.util.plugins import load_plugins

if TYPE_CHECKING:
    from deploykit.flows.base import Flow

ENTRY_POINT_GROUP = "deploykit.flows"
BUILTIN_FLOWS = {
    "portable_fp32": "deploykit.flows.portable_fp32:PortableFp32",
    "cortex_m_int8": "deploykit.flows.cortex_m_int8:CortexMInt8",
    "ethos_u_int8": "deploykit.flows.ethos_u_int8:EthosUInt8",
    "xnnpack_fp32": "deploykit.flows.xnnpack_fp32:XnnpackFp32",
    "xnnpack_int8": "deploykit.flows.xnnpack_int8:XnnpackInt8",
}


@cache
def registry() -> dict[str, Flow]:
    """Every flow by name: the built-in ones, then those of installed packages."""
    from deploykit.flows.base import Flow

    return load_plugins(ENTRY_POINT_GROUP, BUILTIN_FLOWS, Flow, "flow")


def flow_names() -> tuple[str, ...]:
    return tuple(registry())


def get_flow(name: str) -> Flow:
    flows = registry()
    if name not in flows:
        raise ConfigError(f"Unknown flow '{name}'.", f"Use one of: {', '.join(flows)}.")
    return flows[name]
