"""Where the Hopper decode kernel's warps spend their time, phase by phase of the tile loop: Nsight
Compute's warp-state sampling summed between the loop's block barriers, on an sm_90 GPU (the lent H200).

For every format it profiles one launch of ``benchmarks.probes.profile_hopper_decode`` (batch 32,
L = 32768, e4m3 Q; the kernel's default config) under ``ncu --section SourceCounters`` (clocks locked to
base, ncu's default: the shares are the result, not the times), exports the per-instruction samples
(``--page source``), cuts the SASS at each ``BAR.SYNC`` and prints each phase's share of all samples. A
sample is one warp's state at one instant, so a phase's share is the fraction of the warps' time spent in
it. Phases are named by what they hold:

* ``convert``  sub-byte codes to e4m3 tiles (shared loads and stores, no MMA); the ring's wait comes first
* ``conv+QK``  both in one stretch (K in registers, ``HopperConfig.k_registers``: V's tile is converted,
               K's codes go straight into the MMA fragments, between the ring's barrier and the row-max
               barrier)
* ``S = QK``   the Q.K^T MMAs and the row max
* ``softmax``  exp2, row sums, P to shared memory, the O rescale
* ``P.V``      the P.V MMAs (``ldmatrix.trans`` of V)
* ``other``    everything else (prologue, epilogue)

``conv+QK`` applies to e2m1 and fp6 at d = 256. fp6 at d = 128 and NVFP4 run converter warps
(``HopperConfig.converters``): their samples and the MMA warps' fall in the same SASS, cut at the named
barriers too, so their phases mix the two roles.

    python -m benchmarks.probes.phase_samples              # e4m3 and the sub-byte formats
    python -m benchmarks.probes.phase_samples --formats e2m1
    python -m benchmarks.probes.phase_samples --stalls     # and why: the stall reasons per phase

Needs ``ncu`` on the PATH (the device has it) and permission to read the GPU's performance counters.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import tempfile

from benchmarks.probes._ncu import FORMATS, comma_list, run_ncu, tools_missing

PHASES = ("convert", "conv+QK", "S = QK", "softmax", "P.V", "other")
SAMPLES = "Warp Stall Sampling (All Samples)"
STALL_PREFIX = "stall_"  # per-reason sample columns of the export ("stall_wait", ...; not the "(Not Issued)" ones)
STALL_MIN = 2.0  # --stalls prints the reasons holding at least this % of a format's samples


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
    if mma and any(op.startswith("STS.128") for op in opcodes):  # a converted tile's 16-byte stores
        return "conv+QK"
    if mma:
        return "S = QK"
    if any(op.startswith("MUFU.EX2") for op in opcodes):
        return "softmax"
    if any(op.startswith("STS") for op in opcodes) and any(op.startswith(("LOP3", "PRMT")) for op in opcodes):
        return "convert"
    return "other"


def phase_table(source_csv: str) -> dict:
    """``{phase: {column: samples}}`` from ``ncu --page source --csv --print-source sass`` output of one kernel
    (a title row, then the header row, then one row per instruction): the all-samples column (``SAMPLES``)
    and every per-reason stall column (``stall_*``, issued or not) summed over the phase's stretches.
    Raises ValueError when the export has no sample column or no samples."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    head = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if head is None or SAMPLES not in rows[head]:
        raise ValueError(f"phase_table: no '{SAMPLES}' column in the source export")
    hdr = rows[head]
    i_src = hdr.index("Source")
    cols = {name: i for i, name in enumerate(hdr) if name == SAMPLES or
            (name.startswith(STALL_PREFIX) and "Not Issued" not in name)}  # fmt: skip
    table = {p: dict.fromkeys(cols, 0.0) for p in PHASES}
    stretch, ops, first = dict.fromkeys(cols, 0.0), [], True

    def close(name):
        for col in cols:
            table[name][col] += stretch[col]

    for r in rows[head + 1 :]:
        if len(r) <= max(i_src, *cols.values()):
            continue
        op = _opcode(r[i_src])
        for col, i in cols.items():
            stretch[col] += float(r[i] or 0)
        ops.append(op)
        if op.startswith("BAR.SYNC"):  # the stretch before the first barrier is the kernel's prologue
            close("other" if first else phase_of(ops))
            stretch, ops, first = dict.fromkeys(cols, 0.0), [], False
    close("other" if first else phase_of(ops))
    if sum(t[SAMPLES] for t in table.values()) <= 0:
        raise ValueError("phase_table: the export holds no samples")
    return table


def phase_shares(source_csv: str) -> dict:
    """``{phase: percent of all samples}`` (``phase_table``'s sample column)."""
    table = phase_table(source_csv)
    total = sum(t[SAMPLES] for t in table.values())
    return {p: 100.0 * t[SAMPLES] / total for p, t in table.items()}


def stall_shares(table: dict, min_share: float = STALL_MIN) -> tuple:
    """(reasons, ``{phase: {reason: percent of all samples}}``) from ``phase_table``: the stall reasons
    (without the ``stall_`` prefix) that hold at least ``min_share`` % of all samples, most first."""
    total = sum(t[SAMPLES] for t in table.values())
    stalls = {c for t in table.values() for c in t if c.startswith(STALL_PREFIX)}
    overall = {c: 100.0 * sum(t[c] for t in table.values()) / total for c in stalls}
    keep = sorted((c for c in stalls if overall[c] >= min_share), key=lambda c: -overall[c])
    shares = {p: {c[len(STALL_PREFIX) :]: 100.0 * t[c] / total for c in keep} for p, t in table.items()}
    return [c[len(STALL_PREFIX) :] for c in keep], shares


def _profile(fmt: str, batch: int, workdir: str) -> str:
    report = os.path.join(workdir, f"phases_{fmt}")
    target = [sys.executable, "-m", "benchmarks.probes.profile_hopper_decode", "--format", fmt, "--q-dtype",
              "e4m3", "--batch", str(batch), "--launches", "4"]  # fmt: skip
    run_ncu(["ncu", "--target-processes", "all", "-k", "regex:Hopper", "--launch-skip", "3", "--launch-count", "1",
             "--section", "SourceCounters", "-f", "-o", report, *target], "phase_samples")  # fmt: skip
    export = ["ncu", "--import", report + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"]
    return run_ncu(export, "phase_samples")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--formats", default=",".join(FORMATS), type=comma_list(FORMATS, "--formats"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--stalls", action="store_true", help="also print each phase's stall reasons")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error(f"--batch: expected at least 1, got {args.batch}")
    if tools_missing("phase_samples"):
        return 2
    import torch

    print(f"# {torch.cuda.get_device_name()}; Nsight Compute warp-state samples per tile-loop phase, % of all")
    print(f"# batch {args.batch}, L = 32768, 32/8 heads, d = 128, page size 64, e4m3 Q; one launch each")
    print("{:<7} ".format("format") + " ".join(f"{p:>8}" for p in PHASES))
    tables = {}
    with tempfile.TemporaryDirectory(prefix="mjolnir-phases-") as tmp:
        for fmt in args.formats:
            tables[fmt] = phase_table(_profile(fmt, args.batch, tmp))
            total = sum(t[SAMPLES] for t in tables[fmt].values())
            print(f"{fmt:<7} " + " ".join(f"{100 * tables[fmt][p][SAMPLES] / total:7.1f}%" for p in PHASES), flush=True)
    if args.stalls:
        print(f"# stall reasons per phase, % of the format's samples (reasons holding >= {STALL_MIN:g} % of them;"
              " 'selected' = issuing)")  # fmt: skip
        for fmt, table in tables.items():
            reasons, shares = stall_shares(table)
            print(f"{fmt:<8}" + " ".join(f"{r[:12]:>12}" for r in reasons))
            for p in PHASES:
                if any(v > 0.05 for v in shares[p].values()):
                    print(f"  {p:<6}" + " ".join(f"{shares[p][r]:11.1f}%" for r in reasons))
    return 0


if __name__ == "__main__":
    sys.exit(main())
