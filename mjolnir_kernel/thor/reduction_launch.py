# Copyright (c) 2026 Mieszko Syty (Mjolnir)
# SPDX-License-Identifier: BSD-3-Clause
"""A standalone launcher of the split-KV reduction (device code), for testing it on its own.

The reduction uses no tcgen05 instruction, so it runs on any GPU the CuTe DSL targets (sm_90 and
later with PDL): tests compare it with ``mjolnir_numerics.emulator_stages.reduction`` on hardware
even where the decode kernel cannot run.
"""

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute

from .reduction_kernel import SplitReduction


class ReductionLauncher:
    """``cute.compile(ReductionLauncher(max_splits), *args)``; arguments as ``__call__``."""

    def __init__(self, max_splits: int, pdl: bool = False):
        self.reduction = SplitReduction(max_splits, pdl)

    @cute.jit
    def __call__(
        self,
        o_ptr: cute.Pointer,  # (b, h_q, d) bf16, sequence stride o_seq
        lse_ptr: cute.Pointer,  # (b, h_q) fp32
        o_part_ptr: cute.Pointer,  # (max_splits, b, h_q, d) fp32
        m_part_ptr: cute.Pointer,  # (max_splits, b, h_q) fp32
        l_part_ptr: cute.Pointer,  # (max_splits, b, h_q) fp32
        n_splits_ptr: cute.Pointer,  # (b,) int32
        b: cutlass.Int32,
        h_q: cutlass.Int32,
        d: cutlass.Int32,
        o_seq: cutlass.Int32,
        scale_o: cutlass.Float32,
        stream: cuda.CUstream,
    ):
        n_splits = cute.make_tensor(n_splits_ptr, cute.make_layout((b,)))
        self.reduction.launch(
            o_ptr, lse_ptr, o_part_ptr, m_part_ptr, l_part_ptr, n_splits, b, h_q, d, o_seq, scale_o, stream
        )
