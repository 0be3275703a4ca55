"""What both decode kernels share on the device side (imports cutlass): the launch signature and the
global-memory views built from it.

``DecodeEntry.__call__`` takes the positional arguments of ``mjolnir_kernel.host.kernel_arguments`` (the
compile order) and hands them to the kernel's ``launch`` with the pointers bundled by name. The views of
``shared_views`` are the per-call tensors whose layout does not depend on the backend: block table,
sequence lengths, chunks per sequence, the three descales (indexed by the linear (kv head, seq) mode, zero
strides broadcasting per-head / per-tensor scales), LSE and the split partials m / l."""

from types import SimpleNamespace
from typing import Tuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute


class DecodeEntry:
    """Base of both decode kernels: the launch signature, one place. A subclass defines
    ``launch(problem_shape, max_blocks, num_pages, num_work, strides, ptrs, scale_qs, scale_o, stream)``,
    ``ptrs`` naming every pointer as ``mjolnir_kernel.host.POINTER_ORDER`` does."""

    @cute.jit
    def __call__(
        self,
        problem_shape: Tuple[cutlass.Int32, cutlass.Int32, cutlass.Int32, cutlass.Int32],
        max_blocks: cutlass.Int32,
        num_pages: cutlass.Int32,
        num_work: cutlass.Int32,
        strides: Tuple[cutlass.Int32, ...],
        q_ptr: cute.Pointer,
        k_ptr: cute.Pointer,
        v_ptr: cute.Pointer,
        k_scales_ptr: cute.Pointer,
        v_scales_ptr: cute.Pointer,
        block_table_ptr: cute.Pointer,
        seq_lens_ptr: cute.Pointer,
        work_ptr: cute.Pointer,
        n_splits_ptr: cute.Pointer,
        q_descale_ptr: cute.Pointer,
        k_descale_ptr: cute.Pointer,
        v_descale_ptr: cute.Pointer,
        o_ptr: cute.Pointer,
        lse_ptr: cute.Pointer,
        o_part_ptr: cute.Pointer,
        m_part_ptr: cute.Pointer,
        l_part_ptr: cute.Pointer,
        scale_qs: cutlass.Float32,
        scale_o: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        ptrs = SimpleNamespace(
            q=q_ptr, k=k_ptr, v=v_ptr, k_scales=k_scales_ptr, v_scales=v_scales_ptr, block_table=block_table_ptr,
            seq_lens=seq_lens_ptr, work=work_ptr, n_splits=n_splits_ptr, q_descale=q_descale_ptr,
            k_descale=k_descale_ptr, v_descale=v_descale_ptr, o=o_ptr, lse=lse_ptr, o_part=o_part_ptr,
            m_part=m_part_ptr, l_part=l_part_ptr,
        )  # fmt: skip
        self.launch(problem_shape, max_blocks, num_pages, num_work, strides, ptrs, scale_qs, scale_o, stream)

    def launch_reduction(self, ptrs, n_splits, problem_shape, strides, scale_o, stream):
        """The split reduction grid after the decode grid (``self.reduction``: a ``SplitReduction``, or None
        when the config compiles it out). Trace-time only."""
        if cutlass.const_expr(self.reduction is not None):
            b, h_k, n_q, d = problem_shape
            self.reduction.launch(
                ptrs.o, ptrs.lse, ptrs.o_part, ptrs.m_part, ptrs.l_part, n_splits, b, h_k * n_q, d, strides[1],
                scale_o, stream,
            )  # fmt: skip


def shared_views(shape, max_blocks, splits: int, strides, ptrs) -> SimpleNamespace:
    """Views of ``ptrs`` (block_table, seq_lens, n_splits, q/k/v_descale, lse, m_part, l_part).

    Args:
      shape: (b, h_k, n_q, d); max_blocks: block-table row length; splits: partial slots per sequence;
      strides: the 20 element strides of ``mjolnir_kernel.host.STRIDE_FIELDS``.

    Returns: block_table (b, max_blocks) int32, seq_lens / n_splits (b,) int32, q/k/v_descale
      ((h_k, b),) fp32, lse (n_q, (h_k, b)) fp32, m_part / l_part (n_q, (h_k, b), splits) fp32.
    """
    b, h_k, n_q, _ = shape
    (_, _, _, _, _, _, _, _, qd_seq, qd_head, kd_seq, kd_head, vd_seq, vd_head, *_rest) = strides  # fmt: skip
    hb = (h_k, b)
    v = SimpleNamespace()
    v.block_table = cute.make_tensor(ptrs.block_table, cute.make_layout((b, max_blocks), stride=(max_blocks, 1)))
    v.seq_lens = cute.make_tensor(ptrs.seq_lens, cute.make_layout((b,)))
    v.n_splits = cute.make_tensor(ptrs.n_splits, cute.make_layout((b,)))
    v.q_descale = cute.make_tensor(ptrs.q_descale, cute.make_layout((hb,), stride=((qd_head, qd_seq),)))
    v.k_descale = cute.make_tensor(ptrs.k_descale, cute.make_layout((hb,), stride=((kd_head, kd_seq),)))
    v.v_descale = cute.make_tensor(ptrs.v_descale, cute.make_layout((hb,), stride=((vd_head, vd_seq),)))
    v.lse = cute.make_tensor(ptrs.lse, cute.make_ordered_layout(shape=(n_q, hb), order=(0, (1, 2))))
    part = cute.make_ordered_layout(shape=(n_q, hb, splits), order=(0, (1, 2), 3))
    v.m_part = cute.make_tensor(ptrs.m_part, part)
    v.l_part = cute.make_tensor(ptrs.l_part, part)
    return v
