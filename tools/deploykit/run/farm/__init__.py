"""Boards on a labgrid farm: the coordinator session, a place's flashers and serial port, and
the exporter configuration of a board (docs/farm.md)."""
