"""What the Nsight Compute benchmarks (``pipe_floors``, ``phase_samples``) share: the formats they profile,
their comma-list arguments, the check that ncu and a GPU are there, and running ncu."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from typing import Optional

FORMATS = ("e4m3", "e2m1", "nvfp4", "e3m2", "e2m3")  # in the order the tables print them


def comma_list(allowed: tuple, flag: str):
    """An argparse ``type``: a comma-separated list of values from ``allowed`` (at least one), else an error
    naming ``flag``, the allowed values and what was given."""

    def parse(value: str) -> list:
        items = [v.strip() for v in value.split(",") if v.strip()]
        if not items or any(v not in allowed for v in items):
            raise argparse.ArgumentTypeError(f"{flag}: expected a comma list of {', '.join(allowed)}, got {value!r}")
        return items

    return parse


def tools_missing(tool: str) -> Optional[str]:
    """Why ``tool`` cannot profile here (no ncu on the PATH, no CUDA GPU), printed to stderr; None if it can."""
    reason = None
    if shutil.which("ncu") is None:
        reason = "needs Nsight Compute's ncu on the PATH"
    else:
        import torch

        if not torch.cuda.is_available():
            reason = "needs a CUDA GPU"
    if reason:
        print(f"{tool}: {reason}", file=sys.stderr)
    return reason


def run_ncu(cmd: list, tool: str) -> str:
    """Run one ncu command line; its stdout, or RuntimeError with the command and the tail of its output."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-2000:]
        raise RuntimeError(f"{tool}: ncu failed ({' '.join(cmd)}):\n{tail}")
    return done.stdout
