"""The helper kernels' host side (mjolnir_kernel.helpers): where they apply, and what a bad slot does.

Their bits are tested against the spec in tests/numerics/test_fused.py (every path of every helper on a
GPU); here: the checks that run on any machine, and, on a GPU, that an out-of-range slot in an unchecked
write stops the kernel with a device-side error instead of writing out of bounds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from mjolnir_kernel import helpers

from conftest import cuda_only


def test_not_available_on_the_cpu():
    assert not helpers.available("cpu")
    assert not helpers.available(torch.device("cpu"))


def test_write_unsupported_names_what_the_writer_cannot_take():
    pool = torch.empty(4, 16, 2, 64, dtype=torch.uint8)  # 4-bit rows of d = 128
    assert helpers.write_unsupported(pool, None, 128, 4) is None
    assert "multiple of 16" in helpers.write_unsupported(pool, None, 120, 4)
    odd = torch.empty(4, 16, 2, 68, dtype=torch.uint8)[..., :64]  # rows 68 bytes apart: not 8-byte aligned
    assert "8-byte aligned" in helpers.write_unsupported(odd, None, 128, 4)
    assert helpers.write_unsupported(odd, None, 128, 6) is None  # 6-bit chunks need 4 bytes only
    scales = torch.empty(4, 16, 8, 2, dtype=torch.uint8).transpose(-1, -2)
    assert "scale rows" in helpers.write_unsupported(pool, scales, 128, 4)


@cuda_only
def test_unchecked_write_to_a_slot_outside_the_pools_is_a_device_error():
    """Run in a child process: the trap leaves the CUDA context unusable."""
    if not helpers.available("cuda"):
        pytest.skip("the helper kernels do not run here (CuTe DSL missing or compute capability < 9.0)")
    code = textwrap.dedent(
        """
        import torch
        from mjolnir_numerics import PagedKVCache
        k = torch.randn(1, 16, 2, 128)
        cache = PagedKVCache.from_float(k, k, "e2m1", page_size=16, device="cuda")
        rows = torch.randn(1, 2, 128, device="cuda")
        bad = torch.tensor([cache.num_pages * 16], device="cuda")
        cache.write(rows, rows, bad, check=False)
        torch.cuda.synchronize()
        print("NO ERROR")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "NO ERROR" not in run.stdout and run.returncode != 0, run.stdout + run.stderr
    assert "unspecified launch failure" in run.stderr, run.stderr[-2000:]  # the trap: cudaErrorLaunchFailure


def _helper_kernels():
    """Every helper kernel variant the helpers launch, with its placeholder pointers and scalars."""
    import cutlass

    from mjolnir_kernel import helpers_kernel as hk

    i64, f32 = cutlass.Int64(1), cutlass.Float32(1.0)
    nvfp4_ptrs = (("f32", 16), ("f32", 4), ("u8", 1), ("u8", 1), ("f32", 4))
    write_ptrs = (("f32", 16), ("u8", 8), ("u8", 8), ("f32", 4), ("u8", 1), ("u8", 1), ("f32", 4))
    yield "quantize", hk.QuantizeKernel(), (("f32", 16), ("u8", 1), ("u8", 4)), (i64,)
    for bits in (4, 6):
        yield f"pack{bits}", hk.PackKernel(bits), (("u8", 16), ("u8", 8)), (i64,)
    for packed in (False, True):
        ptrs = (*nvfp4_ptrs, ("u8", 8 if packed else 16), ("u8", 1))
        yield f"nvfp4 packed={packed}", hk.NVFP4EncodeKernel(packed, 6.0, 0.125), ptrs, (i64,) * 3 + (f32,)
    for bits, nvfp4 in ((8, False), (6, False), (4, False), (4, True)):
        ptrs = (*write_ptrs, ("u8", helpers._STORE_ALIGN[bits]), ("u8", 1))
        kernel = hk.CacheWriteKernel(bits, nvfp4, True, True, True, 0.125)
        yield f"write {bits}-bit nvfp4={nvfp4}", kernel, ptrs, (i64,) * 14 + (f32,)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_110a"])
def test_helper_kernels_compile_without_spilling(arch):
    """Each helper kernel lowers to a cubin for Hopper and Thor on any machine (no GPU), with no spills."""
    import contextlib
    import io

    from mjolnir_kernel.compile import _file_cache, cutlass_available, parse_ptxas_report

    if cutlass_available() is not None:
        pytest.skip(cutlass_available())
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    for name, kernel, pointers, scalars in _helper_kernels():
        args = [helpers._pointer(kind, 1 << 20, align) for kind, align in pointers]
        log = io.StringIO()
        with _file_cache(False), contextlib.redirect_stderr(log):
            cute.compile(kernel, *args, *scalars, cuda.CUstream(0), options=f"--gpu-arch {arch} remarks{{ptx}}")
        report = parse_ptxas_report(log.getvalue())
        assert report, f"{name}: no ptxas report for {arch}"
        for res in report.values():
            assert res.spill_stores == 0 and res.spill_loads == 0, (name, arch, res)
