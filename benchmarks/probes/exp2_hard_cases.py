"""Writes ``mjolnir_numerics/data/exp2_hard_cases.txt``: the fp32 inputs ``r`` in (-1, 1) whose exact ``2^r``
lies within ``HARD_ULP64`` float64 ulps of an fp32 rounding midpoint, each with its correctly rounded fp32
``2^r`` (decided in decimal arithmetic).

Every other fp32 ``r`` in (-1, 1) has its correctly rounded ``2^r`` in ``float32(y)`` for any float64 ``y``
within ``HARD_ULP64`` ulps of the exact value (a float64 ``exp2`` is within 1-2), so
:func:`mjolnir_numerics.emulator_stages.exp2_f32` needs no data-dependent branch: the float64 ``exp2``
rounded to fp32, and this short list looked up (``r`` with ``|r| < 2^-25`` are never hard: ``2^r`` lies
within ``2^-25 ln 2`` of 1, far from the midpoints ``1 - 2^-25`` and ``1 + 2^-24``).

The scan covers all 2 x 25 x 2^23 inputs with ``|r|`` in [2^-25, 1) (about 10 s on this project's CPU machine):

    python -m benchmarks.probes.exp2_hard_cases [--out mjolnir_numerics/data/exp2_hard_cases.txt] [--check]

``--check`` compares the scan with the file instead of writing it (exit status 1 if they differ).
"""

from __future__ import annotations

import argparse
import sys
import time
from decimal import Decimal, localcontext
from pathlib import Path

import torch

from mjolnir_numerics.emulator_stages import EXP2_HARD_BINADES, EXP2_HARD_CASES, EXP2_HARD_ULP64

_DIGITS = 60
_LOW29 = (1 << 29) - 1
_HALF29 = 1 << 28


def exact_cr(r: float) -> tuple[int, float]:
    """The correctly rounded fp32 ``2^r`` (as its bits) and the exact value's distance from the nearest fp32
    midpoint in float64 ulps of its binade ([1/2, 1) or [1, 2)), for a float ``r`` in (-1, 1), not 0."""
    shift = 24 if r < 0 else 23  # 2^r in (1/2, 1) or (1, 2)
    with localcontext() as ctx:
        ctx.prec = _DIGITS
        exact = (Decimal(r) * Decimal(2).ln()).exp()
        scaled = exact * (Decimal(2) ** shift)  # in [2^23, 2^24): the fp32 significand, its rounding bit the fraction
        fl = int(scaled)
        frac = scaled - fl
        up = frac > Decimal("0.5")
        dist = abs(frac - Decimal("0.5")) * (Decimal(2) ** 29)
    bits = int(torch.tensor((fl + int(up)) * 2.0**-shift, dtype=torch.float32).view(torch.int32))
    return bits, float(dist)


def scan(binades=range(EXP2_HARD_BINADES), log=print) -> list[tuple[int, int]]:
    """``(r bits, fp32 2^r bits)`` of every hard input (int32 bit patterns) with ``|r|`` in [2^-(k+1), 2^-k)
    for k in ``binades``, both signs, ``r``'s bits ascending as int32."""
    found = []
    margin = EXP2_HARD_ULP64 + 4  # the candidates: torch's float64 exp2 within 4 ulps of the exact value
    for sign, k in [(s, k) for s in (1, 0) for k in binades]:
        t0 = time.perf_counter()
        rbits = (torch.arange(1 << 23, dtype=torch.int64) | ((126 - k) << 23) | (sign << 31)).to(torch.int32)
        y = torch.exp2(rbits.view(torch.float32).double())
        low = y.view(torch.int64) & _LOW29
        cand = ((low - _HALF29).abs() <= margin).nonzero().squeeze(1)
        kept = 0
        for i in cand.tolist():
            r = float(rbits[i].view(torch.float32))
            bits, dist = exact_cr(r)
            if dist < EXP2_HARD_ULP64:
                found.append((int(rbits[i]), bits))
                kept += 1
        log(f"binade {k:2d} (r in {'-' if sign else ''}[2^-{k + 1}, 2^-{k})): {cand.numel()} candidates, {kept} hard, "
            f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    return sorted(found)


def write(cases: list[tuple[int, int]], path: Path) -> None:
    lines = [
        "# fp32 r in (-1, 1) whose exact 2^r lies within EXP2_HARD_ULP64 float64 ulps of an fp32 rounding midpoint,",
        "# and the correctly rounded fp32 2^r: int32 bit patterns in hex, r's bits ascending as int32.",
        "# Written by `python -m benchmarks.probes.exp2_hard_cases` (see mjolnir_numerics.emulator_stages.exp2_f32).",
    ]
    lines += [f"{r & 0xFFFFFFFF:08x} {v & 0xFFFFFFFF:08x}" for r, v in cases]
    path.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parents[2] / "mjolnir_numerics" / "data" / EXP2_HARD_CASES
    )
    ap.add_argument("--check", action="store_true", help="compare the scan with --out instead of writing it")
    args = ap.parse_args(argv)
    cases = scan()
    print(f"{len(cases)} hard inputs (within {EXP2_HARD_ULP64} float64 ulps of a midpoint)")
    if args.check:
        from mjolnir_numerics.emulator_stages import _exp2_hard_table

        keys, values = _exp2_hard_table(torch.device("cpu"))
        same = [(int(a), int(b)) for a, b in zip(keys, values)] == cases
        print("the file matches the scan" if same else f"{args.out}: differs from the scan")
        return 0 if same else 1
    write(cases, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
