"""The program stages: export a model (a Python file in models/) to an ExecuTorch `.pte` with
the host's reference outputs (`export`, `models`, `input_sets`; the lowering itself is the
flow's, flows/), the data sets `deploykit validate` scores a model on (`datasets`), and read
it back: `inspect` (segments, delegates, I/O), `costs` (MACs, the
activation lower bound, fallbacks and float islands), `method_memory` (what Method::load
takes)."""
