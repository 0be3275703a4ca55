"""Where the Hopper decode kernel's warps spend their time, phase by phase of the tile loop: Nsight
Compute's warp-state sampling summed between the loop's block barriers, on an sm_90 GPU (the lent H200).

For every format it profiles one launch of ``benchmarks.profile_hopper_decode`` (batch 32, L = 32768,
e4m3 Q, mma.sync) under ``ncu --section SourceCounters`` (clocks locked to base, ncu's default: the shares
are the result, not the times), exports the per-instruction samples (``--page
source``), cuts the SASS at each ``BAR.SYNC`` and prints each phase's share of all samples. A sample is one
warp's state at one instant, so a phase's share is the fraction of the warps' time spent in it. Phases are
named by what they hold:

* ``convert``  sub-byte codes to e4m3 tiles (shared loads and stores, no MMA); the ring's wait comes first
* ``S = QK``   the Q.K^T MMAs and the row max
* ``softmax``  exp2, row sums, P to shared memory, the O rescale
* ``P.V``      the P.V MMAs (``ldmatrix.trans`` of V)
* ``other``    everything else (prologue, epilogue)

    python -m benchmarks.phase_samples                     # e4m3 and the sub-byte formats
    python -m benchmarks.phase_samples --formats e2m1

Needs ``ncu`` on the PATH (the device has it) and permission to read the GPU's performance counters.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile

from benchmarks._ncu import FORMATS, comma_list, run_ncu, tools_missing

PHASES = ("convert", "S = QK", "softmax", "P.V", "other")
SAMPLES = "Warp Stall Sampling (All Samples)"


def _opcode(sass: str) -> str:
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def phase_of(opcodes: list) -> str:
    """The name of a barrier-to-barrier stretch of the tile loop's SASS, from its opcodes (with modifiers)."""
    mma = any(op.startswith("HMMA") for op in opcodes)
    if mma and any(op.startswith("LDSM") and ".MT88" in op for op in opcodes):
        return "P.V"
    if mma:
        return "S = QK"
    if any(op.startswith("MUFU.EX2") for op in opcodes):
        return "softmax"
    if any(op.startswith("STS") for op in opcodes) and any(op.startswith(("LOP3", "PRMT")) for op in opcodes):
        return "convert"
    return "other"


def phase_shares(source_csv: str) -> dict:
    """``{phase: percent of all samples}`` from ``ncu --page source --csv --print-source sass`` output of one
    kernel (a title row, then the header row, then one row per instruction). Raises ValueError when the
    export has no sample column or no samples."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    head = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if head is None or SAMPLES not in rows[head]:
        raise ValueError(f"phase_shares: no '{SAMPLES}' column in the source export")
    hdr = rows[head]
    i_src, i_samples = hdr.index("Source"), hdr.index(SAMPLES)
    shares = dict.fromkeys(PHASES, 0.0)
    stretch, ops, first = 0.0, [], True
    for r in rows[head + 1 :]:
        if len(r) <= max(i_src, i_samples):
            continue
        op = _opcode(r[i_src])
        stretch += float(r[i_samples] or 0)
        ops.append(op)
        if op.startswith("BAR.SYNC"):  # the stretch before the first barrier is the kernel's prologue
            shares["other" if first else phase_of(ops)] += stretch
            stretch, ops, first = 0.0, [], False
    shares["other" if first else phase_of(ops)] += stretch
    total = sum(shares.values())
    if total <= 0:
        raise ValueError("phase_shares: the export holds no samples")
    return {k: 100.0 * v / total for k, v in shares.items()}


def _profile(fmt: str, batch: int, workdir: str) -> str:
    report = os.path.join(workdir, f"phases_{fmt}")
    target = [sys.executable, "-m", "benchmarks.profile_hopper_decode", "--format", fmt, "--q-dtype", "e4m3",
              "--batch", str(batch), "--launches", "4"]  # fmt: skip
    run_ncu(["ncu", "--target-processes", "all", "-k", "regex:Hopper", "--launch-skip", "3", "--launch-count", "1",
             "--section", "SourceCounters", "-f", "-o", report, *target], "phase_samples")  # fmt: skip
    export = ["ncu", "--import", report + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]
    return run_ncu(export, "phase_samples")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS), type=comma_list(FORMATS, "--formats"))
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch: expected at least 1, got {args.batch}")
    if tools_missing("phase_samples"):
        return 2
    import torch

    print(f"# {torch.cuda.get_device_name()}; Nsight Compute warp-state samples per tile-loop phase, % of all")
    print(f"# batch {args.batch}, L = 32768, 32/8 heads, d = 128, page size 64, e4m3 Q, mma.sync; one launch each")
    print("{:<7} ".format("format") + " ".join(f"{p:>8}" for p in PHASES))
    with tempfile.TemporaryDirectory(prefix="mjolnir-phases-") as tmp:
        for fmt in args.formats:
            shares = phase_shares(_profile(fmt, args.batch, tmp))
            print(f"{fmt:<7} " + " ".join(f"{shares[p]:7.1f}%" for p in PHASES), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
