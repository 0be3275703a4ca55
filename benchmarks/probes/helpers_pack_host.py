"""Where ``pack(codes, bits, check=False)``'s eager time goes on CUDA: host time per call (back to back, no
wait) of each layer from the kernel's launch up to the public function, at 1K codes (host-bound) and 16M,
and each one's time per call with the GPU's work (CUDA events over the same calls).

    python -m benchmarks.probes.helpers_pack_host
"""

# ruff: noqa: B023  (the rows' lambdas run inside the loop that binds them)

import time

import torch

from benchmarks.bench_helpers import _time_us
from mjolnir_kernel import helpers
from mjolnir_numerics import fused, pack


def host_us(fn, n=2000):
    """Host time per call of ``n`` calls of ``fn`` back to back (no wait), in microseconds, after one call."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, TVM-FFI {helpers._tvm_ffi()}")
    for n in (1024, 1 << 24):
        for bits in (6, 4):
            codes = torch.randint(0, 1 << bits, (n // 128, 128), dtype=torch.uint8, device="cuda")
            out = torch.empty(n // 128, 128 * bits // 8, dtype=torch.uint8, device="cuda")
            launcher = helpers._kernel(("pack", bits), codes.device, helpers._PACK_BUILDS[bits])
            rows = {
                "out.clone() (a torch launch)": out.clone,
                "torch.empty of the output": lambda: torch.empty_like(out),
                "launcher((codes, out), (n,))": lambda: launcher((codes, out), (n,), codes.device),
                "helpers.pack_codes": lambda: helpers.pack_codes(codes, bits=bits),
                "fused.pack_any": lambda: fused.pack_any(codes, bits=bits),
                "pack(check=False)": lambda: pack(codes, bits, check=False),
            }
            dev, oshape = codes.device, out.shape
            # pack_codes as it was before 929ca51 (torch.empty), built up a statement at a time: which one costs what
            rows["ladder 1: launcher, device bound once"] = lambda: launcher((codes, out), (n,), dev)
            rows["ladder 2: + torch.empty(shape, uint8, dev)"] = lambda: launcher(
                (codes, torch.empty(oshape, dtype=torch.uint8, device=dev)), (n,), dev
            )
            rows["ladder 3: + codes.device each time"] = lambda: launcher(
                (codes, torch.empty(oshape, dtype=torch.uint8, device=codes.device)), (n,), codes.device
            )
            rows["ladder 4: + the output shape from codes.shape"] = lambda: launcher(
                (codes, torch.empty((*codes.shape[:-1], codes.shape[-1] * bits // 8), dtype=torch.uint8,
                                    device=codes.device)), (n,), codes.device
            )  # fmt: skip
            rows["ladder 5: + _aligned, numel, _check_size"] = lambda: (
                helpers._aligned("codes", codes, 16),
                helpers._check_size("codes", codes.numel()),
                launcher(
                    (codes, torch.empty((*codes.shape[:-1], codes.shape[-1] * bits // 8), dtype=torch.uint8,
                                        device=codes.device)), (n,), codes.device
                ),
            )  # fmt: skip
            rows["ladder 6: + the _kernel lookup"] = lambda: helpers._kernel(
                ("pack", bits), codes.device, helpers._PACK_BUILDS[bits]
            )(
                (codes, torch.empty((*codes.shape[:-1], codes.shape[-1] * bits // 8), dtype=torch.uint8,
                                    device=codes.device)), (n,), codes.device
            )  # fmt: skip
            rows["codes.new_empty(shape) alone"] = lambda: codes.new_empty(oshape)
            rows["fused.helper_kernels(codes.device) alone"] = lambda: fused.helper_kernels(codes.device)
            if launcher.raw is not None:  # TVM-FFI: the compiled function itself, no wrapper
                rows["launcher.raw(addresses, n, stream)"] = lambda: launcher.raw(
                    codes.data_ptr(), out.data_ptr(), n, helpers._current_stream(codes.device)
                )
            print(f"n={n}, {bits} bits{'':18s} host us/call   GPU-inclusive us/call")
            for name, fn in rows.items():
                h, g = host_us(fn), _time_us(fn, 1, 200)  # one run of 200 calls between CUDA events
                print(f"  {name:48s} {h:8.1f}   {g:8.1f}")
            # the benchmark's own timing (bench_helpers._time_us: 10 medians of 20 calls between CUDA events)
            clone_us = _time_us(out.clone, 10, 20)
            pack_us = _time_us(lambda: pack(codes, bits, check=False), 10, 20)
            print(f"  bench timing: clone {clone_us:.1f} us, pack(check=False) {pack_us:.1f} us")


if __name__ == "__main__":
    main()
