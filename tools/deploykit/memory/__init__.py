"""The memory stage: `plan` places a program's memory in the board's regions before anything
is compiled (and refuses, naming the region, when it does not fit); `fit` stores what a run
measured (pools, stack, heap) and sizes the next link from it (docs/memory.md)."""
