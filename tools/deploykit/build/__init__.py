"""The build stage: `render` writes the generated C headers and linker files from the board,
the plan and the program (templates/); `cmake` runs CMake and Ninja; `firmware` describes a
built image (ELF, map, sizes) and checks it against the board's memory; `error_table`
generates the error-code table for C, Python and the docs; `library` renders, builds
and stages a library component (docs/library.md). Each family (families/) builds its
image with these."""
