"""Where ``nvfp4_quantize``'s time goes on CUDA: GPU time, host time, and the host time of each step.

    python -m benchmarks.probes.nvfp4_host_breakdown      # on a GPU, with the CuTe DSL (the kernel extra)

Prints, for 16M float32 values as ``(131072, 128)``: the time per call back to back (checked and
``check=False``) beside torch's e4m3 cast, and the GPU time per call (CUDA events around the calls' GPU work
alone). Then, for a 1024-value tensor, every step of the one-launch path (``vector_norm``, then
``helpers.nvfp4_encode_from_amax`` with the global scale computed in the kernel) and its pieces down to the
raw TVM-FFI call: the host time per call in bursts of a few calls (the queue of launches never fills, so
this is the Python and launch cost alone) beside the GPU time per call (when that is the larger, a long run
of calls back to back is GPU-bound however small the input). Last, a profile of the whole unchecked call
(the Python functions and builtins it spends its host time in).
"""

# ruff: noqa: B023  (a probe: its lambdas run inside the loop that binds them)

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch

from mjolnir_kernel import helpers
from mjolnir_numerics import fused, nvfp4_quantize
from mjolnir_numerics.checks import check_bool, check_int, check_tensor
from mjolnir_numerics.formats import E2M1
from mjolnir_numerics.nvfp4 import NVFP4Tensor, _global_scale, _tables

BURST, BURSTS = 20, 100  # host time: calls per timed burst (well under the launch queue), bursts (median)


def us_per_call(fn, n: int) -> float:
    """Wall time per call of ``n`` back-to-back calls, the queue drained before and after."""
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def host_us(fn) -> float:
    """Host time per call: the median over bursts of ``BURST`` calls, each started on an idle device and
    timed before the device is waited for."""
    fn()
    times = []
    for _ in range(BURSTS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(BURST):
            fn()
        times.append((time.perf_counter() - t) / BURST * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


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


def _encoder_pieces(x: torch.Tensor, amax: torch.Tensor) -> tuple:
    """The launch of ``helpers.nvfp4_encode_from_amax`` taken apart: (name, fn) steps."""
    e4m3_lut, e2m1_lut, e4m3_values, _ = _tables(x.device)
    codes, scales, g = helpers.nvfp4_encode_from_amax(
        x, amax, 2.0**-9, e4m3_lut, e2m1_lut, e4m3_values, divisor=E2M1.max_normal, g_divisor=2688.0
    )
    key = ("nvfp4", False, 6.0, 1.0, True, 2688.0)
    launcher = helpers._compiled[(key, x.device.index)]
    tensors = (x, amax, g, e4m3_lut, e2m1_lut, e4m3_values, codes, scales)
    scalars = (x.numel() // 16, x.shape[-1] // 16, 0, 2.0**-9)
    addresses = [t.data_ptr() for t in tensors]
    stream = helpers._current_stream(x.device)
    quantize_out = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    helpers.quantize_f32(x, e4m3_lut)
    q_launcher = helpers._compiled[(("quantize",), x.device.index)]
    q_addresses = [x.data_ptr(), e4m3_lut.data_ptr(), quantize_out.data_ptr()]
    raw = (  # none without TVM-FFI calls (MJOLNIR_TVM_FFI=0 or no apache-tvm-ffi)
        ("  raw TVM-FFI call, 12 args + stream", lambda: launcher.raw(*addresses, *scalars, stream)),
        ("  quantize's raw TVM-FFI call, 4 + stream", lambda: q_launcher.raw(*q_addresses, x.numel(), stream)),
    )  # fmt: skip
    if launcher.raw is None:
        raw = ()
    return (
        ("  3 x torch.empty (codes, scales, g)", lambda: (
            torch.empty(x.shape, dtype=torch.uint8, device=x.device),
            torch.empty(8, 8, dtype=torch.uint8, device=x.device),
            torch.empty_strided((8, 1), (0, 0), dtype=torch.float32, device=x.device))),
        ("  _aligned + _check_size", lambda: (helpers._aligned("x", x, 16), helpers._check_size("x", x.numel()))),
        ("  _kernel lookup", lambda: helpers._kernel(key, x.device, None)),
        ("  launcher(tensors, scalars)", lambda: launcher(tensors, scalars, x.device)),
        *raw,
        ("  _current_stream", lambda: helpers._current_stream(x.device)),
    )  # fmt: skip


def main() -> None:
    kernels = fused.helper_kernels("cuda")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, helper kernels: {kernels is not None}")
    big = torch.randn(1 << 24, device="cuda").reshape(-1, 128)
    big_amax = torch.linalg.vector_norm(big, float("inf"))
    tables = _tables(big.device)[:3]
    print("16M float32 values:")
    rows = [
        ("e4m3 cast", lambda: big.to(torch.float8_e4m3fn)),
        ("nvfp4_quantize checked", lambda: nvfp4_quantize(big)),
        ("nvfp4_quantize check=False", lambda: nvfp4_quantize(big, check=False)),
        ("  vector_norm(inf)", lambda: torch.linalg.vector_norm(big, float("inf"))),
    ]
    if kernels is not None:
        rows.append(("  nvfp4_encode_from_amax", lambda: kernels.nvfp4_encode_from_amax(
            big, big_amax, 2.0**-9, *tables, divisor=E2M1.max_normal, g_divisor=2688.0)))  # fmt: skip
    for name, fn in rows:
        print(f"  {name:30s} {us_per_call(fn, 200):8.1f} us per call   {gpu_us(fn):8.1f} us of GPU")
    if kernels is None:
        print("(the helper kernels do not run here: no per-step breakdown of the one-launch path)")
        return

    x = torch.randn(8, 128, device="cuda")
    amax = torch.linalg.vector_norm(x, float("inf"))
    e4m3_lut, e2m1_lut, e4m3_values, _ = _tables(x.device)
    codes, scales, g = kernels.nvfp4_encode_from_amax(
        x, amax, 2.0**-9, e4m3_lut, e2m1_lut, e4m3_values, divisor=E2M1.max_normal, g_divisor=2688.0
    )
    steps = (
        ("nvfp4_quantize check=False (whole)", lambda: nvfp4_quantize(x, check=False)),
        ("nvfp4_quantize checked (whole)", lambda: nvfp4_quantize(x)),
        ("check_tensor + check_int + 2 check_bool", lambda: (
            check_tensor("x", x, kind="float"), check_int("group", 16, low=1), check_bool("a", False),
            check_bool("b", False))),
        ("x.float(); shape", lambda: (x.float(), x.shape[:-1], x.shape[-1])),
        ("fused.helper_kernels(device)", lambda: fused.helper_kernels(x.device)),
        ("vector_norm(inf)", lambda: torch.linalg.vector_norm(x, float("inf"))),
        ("float(vector_norm) (the checked call's wait)", lambda: float(torch.linalg.vector_norm(x, float("inf")))),
        ("_tables(device)", lambda: _tables(x.device)),
        ("helpers.nvfp4_encode_from_amax", lambda: kernels.nvfp4_encode_from_amax(
            x, amax, 2.0**-9, e4m3_lut, e2m1_lut, e4m3_values, divisor=E2M1.max_normal, g_divisor=2688.0)),
        *_encoder_pieces(x, amax),
        ("NVFP4Tensor(...)", lambda: NVFP4Tensor(codes=codes, scales=scales, global_scale=g, group=16)),
        ("before: _global_scale(amax) (3 kernels)", lambda: _global_scale(amax, 2688.0)),
        ("before: helpers.nvfp4_encode (g given)", lambda: kernels.nvfp4_encode(
            x, g, 2.0**-9, e4m3_lut, e2m1_lut, e4m3_values, divisor=E2M1.max_normal)),
    )  # fmt: skip
    print(f"1024 values, per call: host time in bursts of {BURST} calls (median of {BURSTS}), GPU time:")
    for name, fn in steps:
        print(f"  {name:46s} {host_us(fn):8.1f} us host {gpu_us(fn):8.1f} us GPU")

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(2000):
        nvfp4_quantize(x, check=False)
    profile.disable()
    torch.cuda.synchronize()
    print("profile of 2000 calls of nvfp4_quantize(check=False), 1024 values (times include the profiler's):")
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
