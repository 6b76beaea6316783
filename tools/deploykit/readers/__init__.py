"""The low-level readers and writers the stages stand on, each of one format or source:

- `pte_reader`: an ExecuTorch program (.pte), through ExecuTorch's own schema;
- `boards` (with `schema/`): board files, schema-checked;
- `npu`: a board's `npu:` section and Vela's memory modes;
- `sizes`, `footprint`: an ELF and its link map, as size reports;
- `uf2`: UF2 images (the picotool-compatible writer);
- `protocol/`: the framed result protocol the firmware speaks;
- `trace`: the per-operator event records of profiling firmware;
- `sources`, `doctor`, `op_coverage`: the workspace of pinned upstream sources, the host
  tools, and which operators the runtime has kernels for.

Nothing here imports a stage (program/, memory/, build/, run/, pipeline/, profiling/)."""
