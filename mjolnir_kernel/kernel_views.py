"""Global-memory views both decode kernels build from the launch arguments (device-side; imports cutlass).

The per-call tensors whose layout does not depend on the backend: block table, sequence lengths, chunks
per sequence, the three descales (indexed by the linear (kv head, seq) mode, zero strides broadcasting
per-head / per-tensor scales), LSE and the split partials m / l."""

from types import SimpleNamespace

import cutlass.cute as cute


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
