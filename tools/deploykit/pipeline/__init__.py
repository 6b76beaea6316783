"""The pipeline: `target` resolves once what a command builds for (the board as compiled, its
family, the flow, the build profile, the NPU settings and the runner) into a `Target`;
`profiles` holds the build profiles; `chains` carries a Target through the stages (export →
plan → render → build → run → validate) and `matrix` does it for many targets at once;
`library` chains the models of a library component through export and plan into
build/library.py; `validation` scores a model over a data set on the host and the device."""
