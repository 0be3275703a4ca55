# Copyright (c) 2025 - 2026 NVIDIA CORPORATION & AFFILIATES. All rights reserved.
# Copyright (c) 2026 Mieszko Syty (Mjolnir modifications)
# SPDX-License-Identifier: BSD-3-Clause
#
# Derived from NVIDIA CUTLASS, examples/python/CuTeDSL/cute/blackwell/kernel/
# attention/mixed_input_fmha/mixed_input_fmha_decode.py, through the Mjolnir seed
# (t5_decode.py); this file stays under the BSD-3-Clause license below.
#
# Redistribution and use in source and binary forms, with or without
# modification, are permitted provided that the following conditions are met:
#
# 1. Redistributions of source code must retain the above copyright notice, this
# list of conditions and the following disclaimer.
#
# 2. Redistributions in binary form must reproduce the above copyright notice,
# this list of conditions and the following disclaimer in the documentation
# and/or other materials provided with the distribution.
#
# 3. Neither the name of the copyright holder nor the names of its
# contributors may be used to endorse or promote products derived from
# this software without specific prior written permission.
#
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
# AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
# IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
# DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
# FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
# DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
# SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
# CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
# OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
# OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

"""Split-KV reduction, shared by both decode kernels: merges the fp32 partials of the sequences the plan
split (device code; it uses no tcgen05 instruction, so it runs on sm_90 and later).

One CTA per (128 head-dim elements, packed query row, sequence); thread = head-dim element.
Arithmetic (the spec's ``mjolnir_numerics.emulator_stages.reduction``; docs/numerics.md, step 11):
m_max = max_j m_j; w_j = exp2(log2e * (m_j - m_max)) (0 where m_j is -inf); l = sum_j w_j l_j and
o = sum_j w_j o_j in split order, each term one fma; out = bf16(scale_o * o * (1 / l)) (0 where l is 0);
lse = m_max + log(l).
Sequences with one chunk were finished by the decode kernel and are left alone.
"""

import math
from functools import partial

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

LOG2_E = math.log2(math.e)
D_PER_CTA = 128
_exp2 = partial(cute.math.exp2, fastmath=True)


@dsl_user_op
def mul_rn(a, b, *, loc=None, ip=None) -> cutlass.Float32:
    """``fp32(a * b)``, rounded on its own (``mul.rn.f32``). A multiply with an explicit rounding modifier
    is never contracted into an fma, so a following add sees the rounded product, as the spec writes
    ``lse = fp32(m * lse_scale) + log(l)``. (A plain ``m * s + x`` was contracted into an FFMA in some
    configurations and not others: on the H200 the first 8 query rows of 16-row tiles took the fma, 1 fp32
    ulp of LSE on 2 of 343 conformance cases.)"""
    res = llvm.inline_asm(
        T.f32(),
        [cutlass.Float32(a).ir_value(loc=loc, ip=ip), cutlass.Float32(b).ir_value(loc=loc, ip=ip)],
        "mul.rn.f32 $0, $1, $2;",
        "=f,f,f",
        has_side_effects=False,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
    )
    return cutlass.Float32(res)


# -- the merge arithmetic, one helper per step of the spec's reduction ------------------------------
@cute.jit
def split_weight(m_j: cutlass.Float32, m_max: cutlass.Float32) -> cutlass.Float32:
    """``w_j = ex2(log2e * (m_j - m_max))``, 0 where the chunk saw no key (``m_j`` = -inf)."""
    w = cutlass.Float32(0)
    if m_j != -cutlass.Float32.inf:
        w = _exp2(LOG2_E * (m_j - m_max))
    return w


@cute.jit
def weighted_add(acc: cutlass.Float32, w: cutlass.Float32, x: cutlass.Float32) -> cutlass.Float32:
    """``acc + w * x`` with one rounding (the fma ptxas contracts the spec's multiply-add into)."""
    return cute.math.fma(w, x, acc)


@cute.jit
def inverse_sum(l_acc: cutlass.Float32) -> cutlass.Float32:
    """``1 / l`` (IEEE division), 0 where l is 0 (a row no chunk saw a key of)."""
    inv_l = cutlass.Float32(0)
    if l_acc > cutlass.Float32(0):
        inv_l = 1.0 / l_acc
    return inv_l


@cute.jit
def merged_lse(m_max: cutlass.Float32, l_acc: cutlass.Float32) -> cutlass.Float32:
    """``m_max + log(l)`` (natural log, full-precision ``log``)."""
    return m_max + cute.math.log(l_acc, fastmath=False)


class SplitReduction:
    """Reduction kernel for a compile-time partial-slot count ``max_splits``."""

    def __init__(self, max_splits: int, pdl: bool):
        self.max_splits = int(max_splits)
        self.pdl = bool(pdl)
        self.launch_extra = {"use_pdl": True} if self.pdl else {}

    def launch(
        self, o_ptr, lse_ptr, o_part_ptr, m_part_ptr, l_part_ptr, n_splits, b, h_q, d, o_seq_stride, scale_o, stream
    ):
        """Build the (d, h_q, b[, split]) views and launch; called while tracing the decode __call__."""
        splits = self.max_splits
        o = cute.make_tensor(o_ptr, cute.make_layout((d, h_q, b), stride=(1, d, o_seq_stride)))
        lse = cute.make_tensor(lse_ptr, cute.make_layout((h_q, b)))
        o_part = cute.make_tensor(o_part_ptr, cute.make_layout((d, h_q, b, splits)))
        m_part = cute.make_tensor(m_part_ptr, cute.make_layout((h_q, b, splits)))
        l_part = cute.make_tensor(l_part_ptr, cute.make_layout((h_q, b, splits)))
        self.kernel(o, lse, o_part, m_part, l_part, n_splits, scale_o).launch(
            grid=[cute.ceil_div(d, D_PER_CTA), h_q, b],
            block=[D_PER_CTA, 1, 1],
            cluster=[1, 1, 1],
            stream=stream,
            **self.launch_extra,
        )

    @cute.kernel
    def kernel(
        self,
        o: cute.Tensor,  # (d, h_q, b) bf16, final output
        lse: cute.Tensor,  # (h_q, b) fp32
        o_part: cute.Tensor,  # (d, h_q, b, max_splits) fp32
        m_part: cute.Tensor,  # (h_q, b, max_splits) fp32, natural-log units
        l_part: cute.Tensor,  # (h_q, b, max_splits) fp32
        n_splits: cute.Tensor,  # (b,) int32, chunks per sequence
        scale_o: cutlass.Float32,
    ):
        if cutlass.const_expr(self.pdl):
            # Launched early under PDL: the partials are complete only once the decode grid is done.
            cute.arch.griddepcontrol_wait()
        d_blk, row, seq = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        d_idx = d_blk * D_PER_CTA + tid
        splits = self.max_splits

        used = n_splits[seq]
        if used > splits:
            used = splits

        # All loads first (splits is compile-time): one memory latency, not a dependent chain.
        m = cute.make_rmem_tensor((splits,), cutlass.Float32)
        lsum = cute.make_rmem_tensor((splits,), cutlass.Float32)
        part = cute.make_rmem_tensor((splits,), cutlass.Float32)
        for j in cutlass.range_constexpr(splits):
            m[j] = -cutlass.Float32.inf
            lsum[j] = cutlass.Float32(0)
            part[j] = cutlass.Float32(0)
            if j < used:
                m[j] = m_part[row, seq, j]
                lsum[j] = l_part[row, seq, j]
                part[j] = o_part[d_idx, row, seq, j]

        m_max = -cutlass.Float32.inf
        for j in cutlass.range_constexpr(splits):
            m_max = cute.arch.fmax(m_max, m[j])

        l_acc = cutlass.Float32(0)
        o_acc = cutlass.Float32(0)
        for j in cutlass.range_constexpr(splits):
            w = split_weight(m[j], m_max)
            l_acc = weighted_add(l_acc, w, lsum[j])
            o_acc = weighted_add(o_acc, w, part[j])
        inv_l = inverse_sum(l_acc)

        if used > 1:  # one chunk: the decode kernel already wrote O and LSE
            if d_idx < o.shape[0]:
                o[d_idx, row, seq] = o.element_type(scale_o * o_acc * inv_l)
            if d_blk == 0 and tid == 0:
                lse[row, seq] = merged_lse(m_max, l_acc)


class ReductionLauncher:
    """The reduction alone, for testing it on any GPU the CuTe DSL targets (tests/kernel/test_reduction_gpu.py
    compares it with the spec's reduction): ``cute.compile(ReductionLauncher(max_splits), *args)``."""

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
