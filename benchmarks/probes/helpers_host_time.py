"""Host time per call of the helper paths on CUDA (small n: host-bound), TVM-FFI calls on or off
(``MJOLNIR_TVM_FFI=0``), and a profile-free timing of ``nvfp4_quantize`` (H200, 2026-12-02;
reports/helpers/2026-12-02-h200-kernels-probes.txt).

    python -m benchmarks.probes.helpers_host_time
"""

# ruff: noqa: B023, E402  (a one-off probe: its lambdas run inside the loop that binds them)

import torch
from benchmarks.probes.helpers_pack_host import host_us
from mjolnir_numerics import quantize, pack, fused
from mjolnir_numerics.quantize import _round_to_odd_lut
from mjolnir_numerics.formats import FORMATS
from mjolnir_kernel import helpers


e4m3 = FORMATS["e4m3"]
lut = _round_to_odd_lut(e4m3, "cuda")
for n in (1024, 1 << 24):
    x = torch.randn(n, device="cuda")
    c = quantize(x, "e2m1").reshape(-1, 128) if n > 1024 else quantize(x, "e2m1").reshape(-1, 16)
    print(f"n={n}: tvm-ffi {helpers._tvm_ffi()}")
    print(f"  cast                  {host_us(lambda: x.to(torch.float8_e4m3fn)):8.1f} us host")
    print(f"  torch.empty           {host_us(lambda: torch.empty(n, dtype=torch.uint8, device='cuda')):8.1f} us host")
    print(f"  helpers.quantize_f32  {host_us(lambda: helpers.quantize_f32(x, lut, e4m3)):8.1f} us host")
    print(f"  quantize()            {host_us(lambda: quantize(x, 'e4m3')):8.1f} us host")
    print(f"  pack(check=False)     {host_us(lambda: pack(c, 4, check=False)):8.1f} us host")
    comp = fused.compiled(fused.quantize_f32)
    print(f"  compiled quantize_f32 {host_us(lambda: comp(x, lut), 200):8.1f} us host")

from mjolnir_numerics import nvfp4_quantize

xr = torch.randn(1 << 24, device="cuda").reshape(-1, 128)
print(f"nvfp4_quantize host {host_us(lambda: nvfp4_quantize(xr), 200):8.1f} us")
from torch.profiler import profile, ProfilerActivity

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        nvfp4_quantize(xr)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
