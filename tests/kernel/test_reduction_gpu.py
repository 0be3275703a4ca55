"""The split-KV reduction kernel on hardware, against the spec's reduction stage.

The reduction has no tcgen05 instruction, so this runs on any CUDA GPU of compute capability >= 9.0
(an H200 as well as Thor): the one piece of the kernel's device code testable without a tcgen05 GPU.
"""

import math

import pytest
import torch

from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import compare_outputs

_NO_CUTLASS = cutlass_available()
_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"needs the CuTe DSL: {_NO_CUTLASS}"),
    pytest.mark.skipif(not _GPU, reason="needs a CUDA GPU of compute capability >= 9.0 (sm_90+)"),
]


def _compile(max_splits):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    from mjolnir_kernel.reduction import ReductionLauncher

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"

    def ptr(dtype):
        return make_ptr(dtype, 1 << 20, cute.AddressSpace.gmem, assumed_align=16)

    f32 = cutlass.Float32
    args = (ptr(cutlass.BFloat16), ptr(f32), ptr(f32), ptr(f32), ptr(f32), ptr(cutlass.Int32), 1, 1, 128, 128, 1.0,
            cuda.CUstream(0))  # fmt: skip
    return cute.compile(ReductionLauncher(max_splits), *args, options=f"--opt-level 2 --gpu-arch {arch}")


@pytest.mark.parametrize("max_splits", [3, 16])
def test_reduction_matches_spec(max_splits):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr

    from mjolnir_numerics.emulator_stages import reduction

    g = torch.Generator().manual_seed(max_splits)
    B, G, N, D = 5, 2, 6, 256
    h_q = G * N
    n_splits = torch.tensor([1, 2, max_splits, max(2, max_splits - 1), max_splits], dtype=torch.int32)
    o_part = torch.randn(max_splits, B, h_q, D, generator=g) * 3
    m_part = torch.randn(max_splits, B, h_q, generator=g) * 4
    l_part = torch.rand(max_splits, B, h_q, generator=g) * 100 + 1
    m_part[0, 3, :4] = -math.inf  # a fully masked chunk (causal tail): weight 0
    l_part[0, 3, :4] = 0
    o_part[0, 3, :4] = 0
    # Slots a sequence did not use hold garbage: the kernel must not read them.
    used = torch.arange(max_splits)[:, None] < n_splits[None, :]
    o_part[~used] = float("nan")
    m_part[~used] = float("nan")
    l_part[~used] = float("nan")

    # Spec: absent splits are (0, -inf, 0).
    sp_o = torch.where(used[:, :, None, None], o_part, torch.zeros(()))
    sp_m = torch.where(used[:, :, None], m_part, torch.full((), -math.inf))
    sp_l = torch.where(used[:, :, None], l_part, torch.zeros(()))
    o_ref, lse_ref = reduction(
        sp_o.permute(1, 0, 2, 3).reshape(B, max_splits, G, N, D),
        sp_m.permute(1, 0, 2).reshape(B, max_splits, G, N),
        sp_l.permute(1, 0, 2).reshape(B, max_splits, G, N),
        scale_o=0.75,
    )

    dev = "cuda"
    sentinel = torch.tensor(-7.0).to(torch.bfloat16)
    o = torch.full((B, h_q, D), float(sentinel), dtype=torch.bfloat16, device=dev)
    lse = torch.full((B, h_q), -7.0, dtype=torch.float32, device=dev)
    tensors = [t.to(dev).contiguous() for t in (o_part, m_part, l_part, n_splits)]

    def ptr(dtype, t):
        return make_ptr(dtype, t.data_ptr(), cute.AddressSpace.gmem, assumed_align=16)

    f32 = cutlass.Float32
    compiled = _compile(max_splits)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    compiled(
        ptr(cutlass.BFloat16, o), ptr(f32, lse), ptr(f32, tensors[0]), ptr(f32, tensors[1]), ptr(f32, tensors[2]),
        ptr(cutlass.Int32, tensors[3]), B, h_q, D, h_q * D, 0.75, stream,
    )  # fmt: skip
    torch.cuda.synchronize()
    o, lse = o.cpu(), lse.cpu()
    split = n_splits > 1
    # Sequences with one chunk are left alone (decode wrote them).
    assert (o[~split] == sentinel).all() and (lse[~split] == -7.0).all()
    report = compare_outputs(
        o[split], lse[split], o_ref.reshape(B, h_q, D)[split].to(torch.bfloat16), lse_ref.reshape(B, h_q)[split]
    )
    print(f"reduction max_splits={max_splits}: {report.summary()}")
    assert report.ok, report.summary()
