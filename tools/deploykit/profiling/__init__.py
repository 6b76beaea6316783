"""Per-operator profiling and numerical debugging off the device (docs/profiling.md).

- per-operator times come from the event records of profiling firmware (readers/trace.py);
- `etdump`: the ETDump rebuilt from those records with ExecuTorch's own schema and serializer;
- `chart`: the SVG bar chart of a profile;
- `intermediates`: every operator's device output against the host's, in execution order;
- `stage`: the `deploykit profile` and `run --debug-intermediates` stages (build, run, write);
- `explore`: the program in Google's Model Explorer, with the profile and the errors laid over it.
"""
