"""The run stage: `runners/` (QEMU, Arm FVPs, serial boards, Linux over SSH: one class per
tool), `flashers/` (picotool, UF2 drive, SWD), `farm/` (boards on a labgrid farm),
`transport` (serial ports and sockets), `proxy` (where a board that is not attached is
measured), `validate` (device outputs against the host's), `report` (the run report), `accuracy`
(the metrics and report of a model over a data set),
`selftest` (board support without ExecuTorch) and `library_app` (the example applications
of a library component, built through find_package and run on QEMU)."""
