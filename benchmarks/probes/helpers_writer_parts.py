"""Where the prefill writer's time goes (H200, 2026-12-02; reports/helpers/2026-12-02-h200-kernels-probes.txt):
the landed kernel against variants without the table lookup, without the division, and without both. The
variants exist only for timing (their bits are wrong). One of K / V: 32K tokens x 8 heads x d 128.

    python -m benchmarks.probes.helpers_writer_parts      # on a GPU with the CuTe DSL
"""

# ruff: noqa: B023, E402  (a one-off probe: its lambdas run inside the loop that binds them)

import torch

import mjolnir_kernel.helpers_kernel as hk
from mjolnir_kernel import helpers
from mjolnir_numerics.formats import FORMATS
from mjolnir_numerics.quantize import _round_to_odd_lut


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
    x16 = (torch.randn(n, h, d, device="cuda") * 3).to(torch.bfloat16)
    x32 = x16.float()
    slots = torch.randperm(n + 4096, device="cuda")[:n]
    desc = torch.rand(h, device="cuda") + 0.01
    orig = hk.block_codes
    variants = {
        "product": orig,
        "no lookup": lambda bits, dv, lut: [
            hk.round_to_odd_index(hk.as_i32(hk.div_rn(hk.as_f32(b), dv))) & 0x3F for b in bits
        ],
        "no division": lambda bits, dv, lut: [
            hk.quantize_word(hk.as_i32(hk.mul_rn(hk.as_f32(b), dv)), lut) for b in bits
        ],
        "neither": lambda bits, dv, lut: [hk.round_to_odd_index(b) & 0x3F for b in bits],
    }
    try:
        for bits, fmt in ((8, "e4m3"), (6, "e3m2"), (4, "e2m1")):
            pool = torch.empty((n + 4096) // 16, 16, h, d * bits // 8, dtype=torch.uint8, device="cuda")
            lut = _round_to_odd_lut(FORMATS[fmt], "cuda")
            for name, fn in variants.items():
                hk.block_codes = fn  # read when the kernel is traced
                helpers._compiled.clear()
                for x in (x16, x32):
                    us = t_us(
                        lambda: helpers.write_rows(x, slots, None, desc, pool, None, bits=bits, page_size=16, lut=lut)
                    )
                    gbs = x.numel() * x.element_size() / us / 1e3
                    print(f"{fmt} {name:12s} {str(x.dtype):15s} {us:7.1f} us  {gbs:6.0f} GB/s of input (one of K, V)")
    finally:
        hk.block_codes = orig
        helpers._compiled.clear()


if __name__ == "__main__":
    main()
