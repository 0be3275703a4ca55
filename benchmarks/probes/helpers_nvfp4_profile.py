"""``nvfp4_quantize`` on the H200: the max-|x| reductions side by side and a torch.profiler table of
the checked and unchecked calls (2026-12-02; reports/helpers/2026-12-02-h200-kernels-probes.txt).

    python -m benchmarks.probes.helpers_nvfp4_profile
"""

# ruff: noqa: B023, E402  (a one-off probe: its lambdas run inside the loop that binds them)

import torch
from torch.profiler import profile, ProfilerActivity
from mjolnir_numerics import nvfp4_quantize


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


x = torch.randn(1 << 24, device="cuda").reshape(-1, 128)
print("vector_norm inf", t_us(lambda: torch.linalg.vector_norm(x, float("inf"))))
print("aminmax", t_us(lambda: torch.aminmax(x)))
print("abs().amax()", t_us(lambda: x.abs().amax()))
print("amax + amin", t_us(lambda: (x.amax(), x.amin())))
for check in (False, True):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            nvfp4_quantize(x, check=check)
        torch.cuda.synchronize()
    print(f"check={check}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))
