"""Where the prefill writer's time goes, and what each design choice of its kernel buys: the landed kernel (K
and V in one launch; quotients from a reciprocal; e4m3 and fp6 codes by the hardware's fp8 conversions, e2m1's
through the 4096-entry round-to-odd table; one 16-value chunk per thread) against variants, side by side in one
run:

* ``tables for e4m3``: e4m3 codes through the table as well;
* ``fp6 through the table``: fp6 codes through the round-to-odd table instead of the fp8 conversions at a
  scale (``FP6_BY_FP8``);
* ``e2m1 by the 64K table``: e2m1 (and NVFP4's element) codes through the 65536-entry table at the 16-bit
  index instead of the 4096-entry one at the 12-bit index (``E2M1_INDEX_SHIFT``);
* ``div.rn everywhere``: every quotient by ``div.rn.f32``, no reciprocal;
* ``neither``: no division, no rounding (loads, index arithmetic, packing and stores; wrong bits).

Measured and removed: fp6 / fp4 codes by float arithmetic (2026-12-04: 1.15-1.17x slower than the table for
bfloat16 rows; reports/helpers/2026-12-04-prefill-writer.md); e2m1 codes by integer rounding (2026-12-06, on an
H100: 0.96-1.03x the table's time); e2m1 codes by one float add (2026-12-07, on an H100: 1.25-1.28x the table's
time for bfloat16 rows; tag ``experiment-e2m1-by-add``, reports/helpers/2026-12-07-writer-codes.md); the kernel
compiled for 8 resident CTAs per SM, 32 registers with spills (2026-12-07, on an H100: fp6 5 % faster, e4m3 1 %
and NVFP4 44 % slower; commit 1e04139 has the variant, reports/helpers/2026-12-07-e2m1-table.md).

K and V (e4m3, e3m2, e2m3, e2m1, NVFP4): 32K tokens x 8 heads x d 128 each, bfloat16 and float32, per-head
descales, page size 16; time per call of 20 calls back to back (CUDA events), through
:class:`mjolnir_kernel.helpers.CacheWriter`.

    python -m benchmarks.probes.helpers_writer_parts      # on a GPU with the CuTe DSL
"""

# ruff: noqa: B023  (a one-off probe: its lambdas run inside the loop that binds them)

import torch

import mjolnir_kernel.helpers_kernel as hk
from mjolnir_kernel import helpers
from mjolnir_numerics.formats import FORMATS
from mjolnir_numerics.quantize import _round_to_odd_lut


def _table_store(addr, qs, lut, bits, fmt):
    hk.store_block(addr, [hk.quantize_word(q, lut) for q in qs], bits)


NEITHER = {
    "FP6_BY_FP8": {},
    "quotients_fast": lambda bits, divisor, scale_exp=0: bits,
    "store_block_fast": lambda addr, qs, lut, bits, fmt: hk.store_block(
        addr, [(q >> 24) & ((1 << bits) - 1) for q in qs], bits
    ),
}


def t_us(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / iters


def main():
    n, h, d = 32768, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(0)
    k16 = (torch.randn(n, h, d, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    v16 = torch.randn(n, h, d, device="cuda", generator=gen).to(torch.bfloat16)
    slots = torch.randperm(n + 4096, device="cuda")[:n]
    desc = (torch.rand(h, device="cuda") + 0.01, torch.rand(h, device="cuda") + 0.01)
    names = ("fast_division_ok", "quotients_fast", "store_block_fast", "FP6_BY_FP8", "E2M1_INDEX_SHIFT")
    saved = {name: getattr(hk, name) for name in names}
    print(f"device {torch.cuda.get_device_name()}; K and V in one launch, time per call of 20 back to back")
    try:
        for element in ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"):
            nvfp4 = element == "nvfp4"
            fmt = FORMATS["e2m1" if nvfp4 else element]
            pages = (n + 4096) // 16
            pools = [torch.empty(pages, 16, h, d * fmt.bits // 8, dtype=torch.uint8, device="cuda") for _ in "kv"]
            scales = [torch.empty(pages, 16, h, d // 16, dtype=torch.uint8, device="cuda") for _ in "kv"]
            options = dict(
                element=fmt.name, page_size=16, head_dim=d, lut=_round_to_odd_lut(fmt, "cuda"), nvfp4=nvfp4,
                floor=2.0**-9 if nvfp4 else None, g_scale=0.125 if nvfp4 else 1.0,
            )  # fmt: skip
            variants = {
                "product": {},
                "div.rn everywhere": {"fast_division_ok": lambda amax, dv: amax < 0},
                "neither": NEITHER,
            }
            if element == "e4m3":
                variants["tables for e4m3"] = {"store_block_fast": _table_store}
            if element in ("e3m2", "e2m3"):
                variants["fp6 through the table"] = {"FP6_BY_FP8": {}}
            if element in ("e2m1", "nvfp4"):
                variants["e2m1 by the 64K table"] = {"E2M1_INDEX_SHIFT": 16}
            ref = None
            for name, patch in variants.items():
                for attr, value in saved.items():
                    setattr(hk, attr, patch.get(attr, value))  # read when the kernel is traced
                helpers._compiled.clear()
                for k, v in ((k16, v16), (k16.float(), v16.float())):
                    writer = helpers.CacheWriter(desc, pools, scales if nvfp4 else (None, None), **options)
                    us = t_us(lambda: writer(k, v, slots, None))
                    same = "-"
                    if name != "neither" and k.dtype == torch.bfloat16:
                        got = [p.clone() for p in (*pools, *scales)]
                        ref = ref or got
                        same = "same bytes" if all(torch.equal(a, b) for a, b in zip(ref, got)) else "BYTES DIFFER"
                    gbs = 2 * k.numel() * k.element_size() / us / 1e3
                    print(f"{element} {name:22s} {str(k.dtype):15s} {us:7.1f} us {gbs:6.0f} GB/s of input  {same}")
    finally:
        for attr, value in saved.items():
            setattr(hk, attr, value)
        helpers._compiled.clear()


if __name__ == "__main__":
    main()
