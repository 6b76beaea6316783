"""deploykit: take a PyTorch model onto an Arm microcontroller with ExecuTorch, and check it.

The CLI (`deploykit ...`) is a thin layer over these functions.
"""

from deploykit.api import boards, build, doctor, export, inspect, plan, run, selftest, setup

__all__ = ["boards", "build", "doctor", "export", "inspect", "plan", "run", "selftest", "setup"]
