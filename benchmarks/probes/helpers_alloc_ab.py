"""How ``pack_codes`` allocates its output on CUDA: ``codes.new_empty(shape)`` (landed in 929ca51 on this
probe's H100 run of 2026-12-06, reports/helpers/2026-12-06-launch-path.md) against ``torch.empty(shape,
dtype=, device=)`` (before), each alone and inside ``pack_codes``, with ``torch.empty_like`` of a same-shaped
tensor as the floor: host time per call of 2,000 calls, 7 rounds in alternating order (the host's timings
drift), 1K and 16M codes.

    python -m benchmarks.probes.helpers_alloc_ab
"""

# ruff: noqa: B023  (the rows' lambdas run inside the loop that binds them)

import statistics

import torch

from benchmarks.probes.helpers_pack_host import host_us
from mjolnir_kernel import helpers


def before(codes, bits):
    """``helpers.pack_codes`` as before 929ca51: the output from ``torch.empty(shape, dtype=, device=)``."""
    codes = helpers._aligned("codes", codes, 16)
    n = codes.numel()
    helpers._check_size("codes", n)
    out = torch.empty((*codes.shape[:-1], codes.shape[-1] * bits // 8), dtype=torch.uint8, device=codes.device)
    if n:
        helpers._kernel(("pack", bits), codes.device, helpers._PACK_BUILDS[bits])((codes, out), (n,), codes.device)
    return out


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, TVM-FFI {helpers._tvm_ffi()}")
    for n in (1024, 1 << 24):
        for bits in (6, 4):
            codes = torch.randint(0, 1 << bits, (n // 128, 128), dtype=torch.uint8, device="cuda")
            assert torch.equal(before(codes, bits), helpers.pack_codes(codes, bits=bits))
            out = helpers.pack_codes(codes, bits=bits)
            oshape = out.shape
            rows = {
                "pack_codes before (torch.empty(shape, dtype=, device=))": lambda: before(codes, bits),
                "pack_codes (codes.new_empty(shape))": lambda: helpers.pack_codes(codes, bits=bits),
                "torch.empty(shape, dtype=, device=) alone": lambda: torch.empty(
                    oshape, dtype=torch.uint8, device=codes.device
                ),
                "codes.new_empty(shape) alone": lambda: codes.new_empty(oshape),
                "torch.empty_like(out) alone": lambda: torch.empty_like(out),
            }
            times = {name: [] for name in rows}
            for r in range(7):
                for name in rows if r % 2 == 0 else reversed(rows):
                    times[name].append(host_us(rows[name]))
            print(f"n={n}, {bits} bits: host us per call, median of 7 rounds (min-max)")
            for name, t in times.items():
                print(f"  {name:52s} {statistics.median(t):6.1f}  ({min(t):.1f}-{max(t):.1f})")


if __name__ == "__main__":
    main()
