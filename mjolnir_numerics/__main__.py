"""``python -m mjolnir_numerics demo``: quantize one tensor in every KV format and print the errors."""

from __future__ import annotations

import math
import sys

import torch

from . import FORMATS, BlockScaledFormat, compute_descale, nvfp4_quantize, round_to_format
from .checks import OneLineArgumentParser, int_arg


def format_errors(x: torch.Tensor) -> list[dict]:
    """Per format: bits per value, relative L2 error, max abs error and SQNR (dB) of ``x`` stored with a
    per-tensor descale (amax / max; NVFP4 with its own two-level scales)."""
    rows = []
    for name, fmt in FORMATS.items():
        if isinstance(fmt, BlockScaledFormat):
            y = nvfp4_quantize(x).values
        else:
            d = compute_descale(x.reshape(1, -1, 1, x.shape[-1]), fmt, "per_tensor")
            y = round_to_format(x / d, fmt) * d
        err = y - x
        rel = float(err.norm() / x.norm())
        rows.append(
            dict(
                format=name,
                bits=fmt.bits_per_value,
                rel_l2=rel,
                max_abs=float(err.abs().max()),
                sqnr_db=-20 * math.log10(rel) if rel > 0 else math.inf,
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python -m mjolnir_numerics", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="quantize a Gaussian tensor in every format and print a table of errors")
    demo.add_argument("--n", type=int_arg(16), default=1 << 20, help="number of values (a multiple of 16)")
    demo.add_argument("--seed", type=int_arg(0), default=0)
    args = parser.parse_args(argv)
    if args.n <= 0 or args.n % 16:
        parser.error(f"--n: must be a positive multiple of 16, got {args.n}")
    x = torch.randn(args.n // 16, 16, generator=torch.Generator().manual_seed(args.seed))
    print(f"{args.n} values from N(0, 1), per-tensor descale (amax / max); NVFP4 with its own scales\n")
    print(f"{'format':8} {'bits':>5} {'rel L2':>9} {'max abs':>9} {'SQNR dB':>8}")
    for r in format_errors(x):
        print(f"{r['format']:8} {r['bits']:5.2f} {r['rel_l2']:9.4f} {r['max_abs']:9.4f} {r['sqnr_db']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
