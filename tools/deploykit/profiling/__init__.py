"""Per-operator profiling and numerical debugging off the device (docs/profiling.md).

- `trace`: per-operator times from the event records of profiling firmware;
- `etdump`: the ETDump rebuilt from those records with ExecuTorch's own schema and serializer;
- `chart`: the SVG bar chart of a profile;
- `intermediates`: every operator's device output against the host's, in execution order;
- `stage`: the `deploykit profile` and `run --debug-intermediates` stages (build, run, write).
"""
