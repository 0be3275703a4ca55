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
