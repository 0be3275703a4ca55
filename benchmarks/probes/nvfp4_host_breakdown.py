"""Where ``nvfp4_quantize``'s time goes on CUDA: GPU time, host time, and the host time of each step.

    python -m benchmarks.probes.nvfp4_host_breakdown      # on a GPU, with the CuTe DSL (the kernel extra)

Prints, for 16M float32 values as ``(131072, 128)``: the time per call back to back (checked and
``check=False``) beside torch's e4m3 cast, the GPU time per call (CUDA events around the calls' GPU work
alone), and for a 1024-value tensor (host-bound: the GPU work is negligible) the host time per call of
every step ``nvfp4_quantize`` takes on its one-launch paths (``check=False``: the amax, then the encoder that
computes the global scale from it; checked: the global scale on the host after one wait).
"""

# ruff: noqa: B023  (a probe: its lambdas run inside the loop that binds them)

from __future__ import annotations

import time

import torch

from mjolnir_numerics import fused, nvfp4_quantize
from mjolnir_numerics.checks import check_bool, check_int, check_tensor
from mjolnir_numerics.formats import E2M1
from mjolnir_numerics.nvfp4 import NVFP4Tensor, _global_scale, _tables


def us_per_call(fn, n: int, *, host_only: bool = False) -> float:
    """Wall time per call of ``n`` back-to-back calls, the queue drained first; the clock stops after the
    queue drains again, or with ``host_only`` before (small inputs: the GPU keeps up, so that is the
    Python and launch cost)."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    if not host_only:
        torch.cuda.synchronize()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def gpu_us(fn, n: int = 50) -> float:
    """GPU time per call: CUDA events around ``n`` calls queued behind a long sleep (host cost hidden)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(50_000_000)  # ~tens of ms: the host queues every call before the GPU reaches them
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


def main() -> None:
    kernels = fused.helper_kernels("cuda")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, helper kernels: {kernels is not None}")
    big = torch.randn(1 << 24, device="cuda").reshape(-1, 128)
    print("16M float32 values:")
    for name, fn in (
        ("e4m3 cast", lambda: big.to(torch.float8_e4m3fn)),
        ("nvfp4_quantize checked", lambda: nvfp4_quantize(big)),
        ("nvfp4_quantize check=False", lambda: nvfp4_quantize(big, check=False)),
        ("  vector_norm(inf)", lambda: torch.linalg.vector_norm(big, float("inf"))),
    ):
        print(f"  {name:30s} {us_per_call(fn, 200):8.1f} us per call   {gpu_us(fn):8.1f} us of GPU")

    x = torch.randn(8, 128, device="cuda")
    amax = torch.linalg.vector_norm(x, float("inf"))
    g = _global_scale(amax, 6 * 448.0)
    e2m1_lut = _tables(x.device)[1]
    codes, scales = kernels.nvfp4_encode(x, g.float(), 2.0**-9, e2m1_lut, divisor=6.0)
    kernels.nvfp4_encode_global(x, amax, 2.0**-9, e2m1_lut, global_divisor=6 * 448.0)
    from mjolnir_kernel import helpers

    key = next(k for k in helpers._compiled if k[0][0] == "nvfp4" and k[0][-1] is not None)  # the global mode
    launcher = helpers._compiled[key]
    print(f"one-launch encoder: TVM-FFI {launcher.ffi}, raw function {launcher.raw is not None}")
    out = (codes, scales, torch.ones((), device="cuda"))
    tensors = (x, amax.reshape(1), e2m1_lut, *out)
    steps = (
        ("nvfp4_quantize check=False (whole)", lambda: nvfp4_quantize(x, check=False)),
        ("nvfp4_quantize checked (whole)", lambda: nvfp4_quantize(x)),
        ("check_tensor + check_int + 2 check_bool", lambda: (
            check_tensor("x", x, kind="float"), check_int("group", 16, low=1), check_bool("a", False),
            check_bool("b", False))),
        ("x.float(); shape", lambda: (x.float(), x.shape[:-1], x.shape[-1])),
        ("vector_norm(inf)", lambda: torch.linalg.vector_norm(x, float("inf"))),
        ("_global_scale(amax, 6 * 448)", lambda: _global_scale(amax, 6 * 448.0)),
        ("float(vector_norm) (a wait)", lambda: float(torch.linalg.vector_norm(x, float("inf")))),
        ("torch.full((), v, cuda)", lambda: torch.full((), 1.5, dtype=torch.float32, device=x.device)),
        ("g.float(); broadcast_to", lambda: torch.broadcast_to(g.float(), (8, 1))),
        ("fused.helper_kernels(device)", lambda: fused.helper_kernels(x.device)),
        ("_tables(device)", lambda: _tables(x.device)),
        ("kernels.nvfp4_encode", lambda: kernels.nvfp4_encode(
            x, g.float(), 2.0**-9, e2m1_lut, divisor=E2M1.max_normal)),
        ("kernels.nvfp4_encode_global (check=False's)", lambda: kernels.nvfp4_encode_global(
            x, amax, 2.0**-9, e2m1_lut, global_divisor=2688.0)),
        ("  its launcher call alone", lambda: launcher(tensors, (64, 8, 0, 2.0**-9), x.device)),
        ("2 x torch.empty uint8", lambda: (
            torch.empty(8, 128, dtype=torch.uint8, device="cuda"),
            torch.empty(8, 8, dtype=torch.uint8, device="cuda"))),
        ("codes.view, scales.view", lambda: (codes.view(x.shape), scales.view(8, 8))),
        ("NVFP4Tensor(...)", lambda: NVFP4Tensor(codes=codes, scales=scales, global_scale=g, group=16)),
    )  # fmt: skip
    print("host time per call, 1024 values:")
    for name, fn in steps:
        print(f"  {name:40s} {us_per_call(fn, 2000, host_only=True):8.1f} us")


if __name__ == "__main__":
    main()
