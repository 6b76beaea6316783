"""Small helpers that know nothing of models or boards: the error types, atomic file writes,
locks, progress lines, paths of deploykit's data, plugin loading, subprocesses, JSON, and the
pinned tool environments of helper programs. Every other folder may import from here; nothing
here imports from another folder."""
