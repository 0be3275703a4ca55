"""Probe (issue 24): does torch's inductor keep the float32 roundings of a chain of emulated fp32 operations?

A chain written the plain way (each step computed in float64, then ``.float()``, then widened again by the
next step) against the same chain rounded by :func:`mjolnir_numerics.arithmetic.round_nearest_f32` (integer
operations on the bits), each compiled by ``torch.compile`` for this machine's CPU and compared with its eager
bits. Torch 2.11's inductor (the lent GPUs' torch) rewrites ``float64 -> float32 -> float64`` as no conversion
(its ``pointless_convert`` pass), so the plain chain loses its roundings there, on any device; 2.13 keeps
widening pairs. The emulator's compiled stages use the second form.

    python -m benchmarks.probes.inductor_roundings
"""

from __future__ import annotations

import sys

import torch


def plain(a, b, c):
    for _ in range(4):
        c = (a.double() * b.double() + c.double()).float()
        c = (c.double() / b.double()).float()
    return c


def integer_rounded(a, b, c):
    from mjolnir_numerics.arithmetic import round_nearest_f32

    for _ in range(4):
        c = round_nearest_f32(a.double() * b.double() + c.double())
        c = round_nearest_f32(c.double() / b.double())
    return c


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(1 << 16, generator=gen) for _ in range(3))
    print(f"# torch {torch.__version__}, inductor on the CPU, 65,536 chains of 4 fma + 4 divisions")
    for fn in (plain, integer_rounded):
        eager = fn(a, b, c)
        compiled = torch.compile(fn, fullgraph=True, dynamic=True)(a, b, c)
        differ = int((eager.view(torch.int32) != compiled.view(torch.int32)).sum())
        print(f"{fn.__name__:16s} compiled results that differ from eager: {differ}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
