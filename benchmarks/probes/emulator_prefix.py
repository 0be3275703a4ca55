"""Probe (issue 24): what ``emulate_decode`` costs on the host before its first window, on CUDA.

A call whose windows replay kept CUDA graphs takes about its host prefix (argument checks, the plan, the
per-call constants) plus the GPU's work, which waits for the prefix. This probe times the prefix alone at the
shape of a ``bench_emulator_gpu`` row (the call stops where the windows would start) and lists the operations
that made the host wait for the device (torch's sync debug mode), each with the line of the emulator's code
that ran it:

    python -m benchmarks.probes.emulator_prefix [--row b32_32k_e4m3_e4m3q] [--repeat 20]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
import traceback
import warnings
from unittest import mock

import torch


class _Stop(Exception):
    """Raised where the first window would start."""


def _stop(*args):
    raise _Stop


def _call(fn) -> None:
    try:
        fn()
    except _Stop:
        return
    raise AssertionError("emulate_decode returned before its windows: the probe's stop was not reached")


def _sync_sites(fn) -> collections.Counter:
    """The innermost mjolnir_numerics frame of each synchronising operation of one ``fn()`` call."""
    sites: collections.Counter = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack() if "mjolnir_numerics" in f.filename]
        f = frames[-1] if frames else None
        sites[f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.line}" if f else "(outside mjolnir_numerics)"] += 1

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            _call(fn)
    finally:
        warnings.showwarning = shown
        torch.cuda.set_sync_debug_mode("default")
    return sites


def main(argv=None) -> int:
    from benchmarks.bench_emulator_gpu import ROWS, row_inputs
    from mjolnir_numerics import emulator
    from mjolnir_numerics.emulator import emulate_decode

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--row", default="b32_32k_e4m3_e4m3q", choices=sorted(ROWS), help="the shape")
    parser.add_argument("--repeat", type=int, default=20, help="timed prefixes (median)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("emulator_prefix: needs a CUDA GPU", file=sys.stderr)
        return 2

    cache, q, kw, _ = row_inputs(ROWS[args.row], torch.Generator(device="cuda").manual_seed(0))

    def prefix():
        emulate_decode(q, cache, **kw)

    with mock.patch.object(emulator, "_window", _stop):
        _call(prefix)  # first call: imports, tables
        times = []
        for _ in range(args.repeat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _call(prefix)
            torch.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - t0))
        sites = _sync_sites(prefix)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; row {args.row}")
    med, lo, hi = statistics.median(times), min(times), max(times)
    print(f"prefix: median {med:.2f} ms of {args.repeat} calls (min {lo:.2f}, max {hi:.2f})")
    print(f"synchronising operations: {sum(sites.values())}")
    for site, n in sites.most_common():
        print(f"  {n:3d}  {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
