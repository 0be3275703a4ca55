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

"""Paged decode attention for tcgen05 GPUs (Thor sm_110a, B200 sm_100a): device code only.

One CTA per (work item, query-row tile, KV head). A work item (seq, tile_begin, tile_end, slot) of
the split plan is a contiguous range of 128-key tiles of one sequence; the CTA streams it front to
back. Warp roles:

  warpgroup 0            softmax: mask, running column max, P, row sums, O rescale, epilogue
  warpgroups 1..c        convert (bf16 Q: e4m3 K/V -> bf16 in TMEM; nvfp4: e2m1 * scale -> e4m3 smem)
  last warpgroup, warp 0 MMA K.Q (GEMM1, S in TMEM)     warp 1  MMA V.P (GEMM2, O in TMEM)
                  warp 2 TMA K/V pages (paged ring)     warp 3  TMA Q

Tensors seen by the kernel (element strides from the host):
  Q  (n_q, d, (h_k, b))  packed query rows n = qi * h_r + hr of a KV head, d contiguous
  K  (PS, d, (h_k, pages))   V  (d, PS, (h_k, pages))  logical views of any layout with d contiguous
  O  (d, n_q, (h_k, b)) bf16, LSE (n_q, (h_k, b)) fp32, partials o/m/l with a trailing split mode.
The arithmetic, stage by stage, is the spec's (mjolnir_numerics.emulator_stages; docs/numerics.md);
mjolnir_numerics.emulate_decode models it.
"""

from functools import partial
from types import SimpleNamespace
from typing import Type


import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.memory
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass.cute.nvgpu import OperandMajorMode, tcgen05

from .config import (
    EVICT_FIRST_POLICY,
    MMA_K,
    MMA_M,
    NVFP4_GROUP,
    NVFP4_SHIFT,
    O_STAGES,
    SP_STAGES,
    SWIZZLE_ALIGN,
    TILE_KEYS,
    WARP_THREADS,
    WARPGROUP_THREADS,
    ThorConfig,
    can_implement_thor,
)
from ..kernel_views import DecodeEntry, shared_views
from ..reduction import LOG2_E, SplitReduction, mul_rn

WARPS_PER_WARPGROUP = WARPGROUP_THREADS // WARP_THREADS
LEAD = SP_STAGES - 1  # K of tile s + LEAD is loaded before V of tile s (consumers drain in that order)
MMA_MODES = (0, 1, 2)
MMA_SLICE = (None, None, None)  # (MMA, #MMA_M, #MMA_K)
CPY_SLICE = (None,) + MMA_SLICE  # (CPY, #CPY_MMA, #CPY_M, #CPY_K)
NVFP4_CHUNK = 32  # e2m1 codes one convert thread handles per row pass (16 B, two scale groups)

_exp2 = partial(cute.math.exp2, fastmath=True)  # ex2.approx.ftz.f32
_add2 = cute.arch.add_packed_f32x2
_mul2 = cute.arch.mul_packed_f32x2
_fma2 = cute.arch.fma_packed_f32x2
_smem_fmax = partial(cute.arch.atomic_fmax, sem="relaxed", scope="cta")


def _warp_fmax(x):
    """Warp-wide fmax by butterfly shuffles (redux.f32 is rejected by ptxas on sm_110a)."""
    for offset in (16, 8, 4, 2, 1):
        x = cute.arch.fmax(x, cute.arch.shuffle_sync_bfly(x, offset=offset, mask=0xFFFFFFFF), nan=True)
    return x


# Element types of the MMA's A operand (K/V), of the KV ring in smem, and the type whose size TMA
# credits to a stage barrier (the packed global size: fp6 12 KiB, fp4 8 KiB per 128 x 128 stage).
_KV_GMEM_TYPE = {
    "e4m3": cutlass.Float8E4M3FN,
    "e3m2": cutlass.Float6E3M2FN,
    "e2m3": cutlass.Float6E2M3FN,
    "e2m1": cutlass.Float4E2M1FN,
    "nvfp4": cutlass.Float4E2M1FN,
}


class ThorDecodeKernel(DecodeEntry):
    """The decode kernel for one ``ThorConfig``; ``cute.compile(ThorDecodeKernel(cfg), *args)``.

    ``__call__`` arguments (all runtime):
      problem_shape (b, h_k, n_q, d) int32; max_blocks (block-table row length); num_pages;
      num_work (work items, grid x); strides: the 20 element strides of ``host.STRIDE_FIELDS``;
      pointers q, k, v, k_scales, v_scales (nvfp4; else any e4m3 pointer), block_table (b, max_blocks)
      int32, seq_lens (b,) int32, work (num_work, 4) int32, n_splits (b,) int32, q/k/v descale fp32,
      o bf16, lse fp32, o/m/l partials fp32 (max_splits, b, h_k, n_q[, d]); scale_qs, scale_o fp32;
      the CUDA stream.
    """

    def __init__(self, config: ThorConfig):
        can_implement_thor(config)
        self.config = config
        dv = config.derived
        self.softmax_wg = 0
        self.cvt_wg_begin = 1
        self.cvt_wg_end = 1 + dv.convert_warpgroups
        base = (1 + dv.convert_warpgroups) * WARPS_PER_WARPGROUP
        self.mma_kq_warp = base + 0
        self.mma_vp_warp = base + 1
        self.tma_kv_warp = base + 2
        self.tma_q_warp = base + 3
        # .launch() extras are built here, in plain Python (the DSL rewrites conditionals in __call__).
        self.launch_extra = {"use_pdl": True} if config.pdl else {}
        self.tiles_d = config.head_dim // MMA_K  # K stages per tile (= V stages, = Q stages)
        self.reduction = SplitReduction(config.max_splits, config.pdl) if config.max_splits > 1 else None

    # ------------------------------------------------------------------------------------------
    # Host-side tracing helpers (plain Python, called while tracing __call__)
    # ------------------------------------------------------------------------------------------
    def _operand_types(self, q_dtype):
        """(K/V A-operand type of both GEMMs, KV ring smem type, type TMA credits per ring stage)."""
        fmt = self.config.kv_format
        if fmt == "nvfp4":  # converted to e4m3 in smem, then the plain fp8 MMA
            return q_dtype, q_dtype, q_dtype
        if fmt in ("e3m2", "e2m3", "e2m1"):  # kind::f8f6f4 reads fp6/fp4 from 1-byte containers
            return _KV_GMEM_TYPE[fmt], cutlass.Int8, _KV_GMEM_TYPE[fmt]
        if self.config.fp8:
            return q_dtype, cutlass.Float8E4M3FN, cutlass.Float8E4M3FN
        return q_dtype, cutlass.Float8E4M3FN, cutlass.Float8E4M3FN  # bf16 path: A = bf16 in TMEM

    def _tiled_mmas(self, q_dtype, kv_mma_dtype):
        """GEMM1 S(s, n) = K(s, d) . Q(n, d) and GEMM2 O(d, n) = V(d, s) . P(s, n), M = 128 keys/d."""
        fp8 = self.config.fp8
        source = tcgen05.OperandSource.SMEM if fp8 else tcgen05.OperandSource.TMEM
        mn = (MMA_M, self.config.q_tile)
        kq = sm100_utils.make_trivial_tiled_mma(
            kv_mma_dtype,
            q_dtype,
            OperandMajorMode.K,
            OperandMajorMode.K,
            cutlass.Float32,
            tcgen05.CtaGroup.ONE,
            mn,
            source,
        )
        # V is head-dim-major in smem on the fp8 path; TMEM operands must be K-major (bf16 path).
        v_major = OperandMajorMode.MN if fp8 else OperandMajorMode.K
        vp = sm100_utils.make_trivial_tiled_mma(
            kv_mma_dtype, q_dtype, v_major, OperandMajorMode.MN, cutlass.Float32, tcgen05.CtaGroup.ONE, mn, source
        )
        return kq, vp

    def _views(self, shape, max_blocks, num_pages, strides, ptrs):
        """Global tensors from pointers and element strides (see the module docstring)."""
        b, h_k, n_q, d = shape
        (q_seq, o_seq, k_page, k_row, k_head, v_page, v_row, v_head, _qd_seq, _qd_head, _kd_seq, _kd_head,
         _vd_seq, _vd_head, ks_page, ks_row, ks_head, vs_page, vs_row, vs_head) = strides  # fmt: skip
        ps = self.config.page_size
        splits = self.config.max_splits
        hb = (h_k, b)
        # block table, lengths, descales, LSE, m / l partials: as in every decode kernel
        v = shared_views(shape, max_blocks, splits, strides, ptrs)
        v.q = cute.make_tensor(ptrs.q, cute.make_layout((n_q, d, hb), stride=(d, 1, (n_q * d, q_seq))))
        pages = (h_k, num_pages)
        v.k = cute.make_tensor(ptrs.k, cute.make_layout((ps, d, pages), stride=(k_row, 1, (k_head, k_page))))
        v.v = cute.make_tensor(ptrs.v, cute.make_layout((d, ps, pages), stride=(1, v_row, (v_head, v_page))))
        # nvfp4 reads V token-major like K; the e4m3 block scales are (PS, d/16) per (head, page).
        v.v_tok = cute.make_tensor(ptrs.v, cute.make_layout((ps, d, pages), stride=(v_row, 1, (v_head, v_page))))
        groups = d // NVFP4_GROUP
        v.k_scales = cute.make_tensor(
            ptrs.k_scales, cute.make_layout((ps, groups, pages), stride=(ks_row, 1, (ks_head, ks_page)))
        )
        v.v_scales = cute.make_tensor(
            ptrs.v_scales, cute.make_layout((ps, groups, pages), stride=(vs_row, 1, (vs_head, vs_page)))
        )
        v.o = cute.make_tensor(ptrs.o, cute.make_layout((d, n_q, hb), stride=(1, d, (n_q * d, o_seq))))
        v.o_part = cute.make_tensor(
            ptrs.o_part, cute.make_ordered_layout(shape=(d, n_q, hb, splits), order=(0, 1, (2, 3), 4))
        )
        return v

    def _smem_layouts(self, kq_mma, vp_mma, q_dtype, kv_stage_dtype):
        dv = self.config.derived
        tiler = (MMA_M, self.config.q_tile, MMA_K)
        lay = SimpleNamespace()
        lay.q = sm100_utils.make_smem_layout_b(kq_mma, tiler, q_dtype, dv.q_stages)
        lay.k = sm100_utils.make_smem_layout_a(kq_mma, tiler, kv_stage_dtype, dv.kv_stages)
        lay.v = sm100_utils.make_smem_layout_a(vp_mma, tiler, kv_stage_dtype, dv.kv_stages, is_k_major=False)
        # O tile: only its shape is used (TMEM fragment / softmax partition); O is stored from registers.
        atom_o = tcgen05.make_smem_layout_atom(tcgen05.mma.SmemLayoutAtomKind.MN_SW128, cutlass.Float32)
        o = cute.tile_to_shape(atom_o, (self.config.head_dim, self.config.q_tile), order=(1, 0))
        lay.o = cute.flat_divide(o, (MMA_M, self.config.q_tile))
        return lay

    def _tma_atoms(self, views, lay, kq_mma, vp_mma, kv_stage_dtype):
        """TMA atoms for Q (whole rows) and K/V: one box per page (PS < 128), one box per stage
        (PS == 128), or packed e2m1 boxes of one page x the whole head dim (nvfp4)."""
        cfg = self.config
        ps = cfg.page_size
        tiler = (MMA_M, cfg.q_tile, MMA_K)
        op = cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp()
        atoms = SimpleNamespace()
        atoms.q, atoms.q_tensor = cute.nvgpu.make_tiled_tma_atom_B(
            op, views.q, cute.select(lay.q, MMA_MODES), tiler, kq_mma
        )
        if cfg.kv_format == "nvfp4":
            box = cute.make_layout((ps, cfg.head_dim), stride=(cfg.head_dim, 1))
            atoms.k, atoms.k_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(op, views.k, box, (ps, cfg.head_dim))
            atoms.v, atoms.v_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(op, views.v_tok, box, (ps, cfg.head_dim))
        elif ps == TILE_KEYS:
            atoms.k, atoms.k_tensor = cute.nvgpu.make_tiled_tma_atom_A(
                op, views.k, cute.select(lay.k, MMA_MODES), tiler, kq_mma, internal_type=kv_stage_dtype
            )
            atoms.v, atoms.v_tensor = cute.nvgpu.make_tiled_tma_atom_A(
                op, views.v, cute.select(lay.v, MMA_MODES), tiler, vp_mma, internal_type=kv_stage_dtype
            )
        else:
            # A stage (MMA, #MMA_M, #MMA_K) flattens colexicographically to m + 128 * k: relabel
            # (rows, cols) sub-boxes with a (1, 128)-strided layout; the swizzle stays composed.
            k_box = cute.composition(cute.select(lay.k, MMA_MODES), cute.make_layout((ps, MMA_K), stride=(1, MMA_M)))
            v_box = cute.composition(cute.select(lay.v, MMA_MODES), cute.make_layout((MMA_M, ps), stride=(1, MMA_M)))
            atoms.k, atoms.k_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(
                op, views.k, k_box, (ps, MMA_K), internal_type=kv_stage_dtype
            )
            atoms.v, atoms.v_tensor = cute.nvgpu.cpasync.make_tiled_tma_atom(
                op, views.v, v_box, (MMA_M, ps), internal_type=kv_stage_dtype
            )
        return atoms

    # ------------------------------------------------------------------------------------------
    # Entry point: views, TMA atoms, launches
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def launch(self, problem_shape, max_blocks, num_pages, num_work, strides, ptrs, scale_qs, scale_o, stream):
        """The grids of one call (traced inside ``DecodeEntry.__call__``, the launch signature)."""
        cfg = self.config
        q_dtype = ptrs.q.dtype
        kv_mma_dtype, kv_stage_dtype, _ = self._operand_types(q_dtype)
        kq_mma, vp_mma = self._tiled_mmas(q_dtype, kv_mma_dtype)
        views = self._views(problem_shape, max_blocks, num_pages, strides, ptrs)
        work = cute.make_tensor(ptrs.work, cute.make_layout((num_work, 4), stride=(4, 1)))
        lay = self._smem_layouts(kq_mma, vp_mma, q_dtype, kv_stage_dtype)
        atoms = self._tma_atoms(views, lay, kq_mma, vp_mma, kv_stage_dtype)
        b, h_k, n_q, d = problem_shape

        self.kernel(
            kq_mma, vp_mma, q_dtype, kv_stage_dtype,
            lay.q, atoms.q, atoms.q_tensor, lay.k, atoms.k, atoms.k_tensor, lay.v, atoms.v, atoms.v_tensor, lay.o,
            views.block_table, views.seq_lens, work, views.n_splits, views.q_descale, views.k_descale,
            views.v_descale, views.k_scales, views.v_scales, views.o, views.lse, views.o_part, views.m_part,
            views.l_part, h_k, n_q, num_pages, scale_qs, scale_qs * LOG2_E, scale_o,
        ).launch(
            grid=(num_work, cute.ceil_div(n_q, cfg.q_tile), h_k),
            block=[cfg.derived.threads, 1, 1],
            cluster=[1, 1, 1],
            stream=stream,
            min_blocks_per_mp=cfg.ctas_per_sm,  # caps registers per thread for ctas_per_sm CTAs/SM
            **self.launch_extra,
        )  # fmt: skip

        self.launch_reduction(ptrs, views.n_splits, problem_shape, strides, scale_o, stream)

    # ------------------------------------------------------------------------------------------
    # The decode kernel: shared resources, then one stage per warp role
    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        kq_mma: cute.TiledMma,
        vp_mma: cute.TiledMma,
        q_dtype: Type[cutlass.Numeric],
        kv_stage_dtype: Type[cutlass.Numeric],
        q_smem: cute.ComposedLayout,
        q_atom: cute.CopyAtom,
        mQ: cute.Tensor,
        k_smem: cute.ComposedLayout,
        k_atom: cute.CopyAtom,
        mK: cute.Tensor,
        v_smem: cute.ComposedLayout,
        v_atom: cute.CopyAtom,
        mV: cute.Tensor,
        o_smem: cute.ComposedLayout,
        mBT: cute.Tensor,
        mSeqLens: cute.Tensor,
        mWork: cute.Tensor,
        mNSplits: cute.Tensor,
        mQD: cute.Tensor,
        mKD: cute.Tensor,
        mVD: cute.Tensor,
        mKS: cute.Tensor,
        mVS: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mOp: cute.Tensor,
        mMp: cute.Tensor,
        mLp: cute.Tensor,
        h_k: cutlass.Int32,
        n_q: cutlass.Int32,
        num_pages: cutlass.Int32,
        scale_qs: cutlass.Float32,
        scale_qs_log2_e: cutlass.Float32,
        scale_o: cutlass.Float32,
    ):
        cfg = self.config
        dv = cfg.derived
        fp8 = cfg.fp8
        nvfp4 = cfg.kv_format == "nvfp4"
        n_tile = cfg.q_tile

        work_idx, q_tile_idx, kv_head = cute.arch.block_idx()
        tidx, _, _ = cute.arch.thread_idx()
        warp_idx = cute.arch.make_warp_uniform(tidx // WARP_THREADS)
        wg_idx = cute.arch.make_warp_uniform(tidx // WARPGROUP_THREADS)

        # PDL: wait for the previous grid (Q / KV writes, an earlier reduction reading the partials)
        # before the first global access; then let the reduction launch and wait for us in turn.
        if cutlass.const_expr(cfg.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        # Work item: tiles [tile_begin, tile_end) of sequence seq into partial slot `slot`.
        seq = mWork[work_idx, 0]
        tile_begin = mWork[work_idx, 1]
        tile_end = mWork[work_idx, 2]
        slot = mWork[work_idx, 3]
        n_iters = tile_end - tile_begin
        idle = n_iters <= 0  # padding work item (CUDA-graph padded list): exits at once

        smem = cutlass.memory.SmemAllocator()
        if warp_idx == 0 and not idle:
            cute.nvgpu.cpasync.prefetch_descriptor(q_atom)
            cute.nvgpu.cpasync.prefetch_descriptor(k_atom)
            cute.nvgpu.cpasync.prefetch_descriptor(v_atom)
        tmem_holder = smem.allocate_array(cutlass.Int32)
        if warp_idx == 1 and not idle:
            cute.arch.alloc_tmem(dv.tmem_cols, tmem_holder)

        kv_tx_bytes = cute.size_in_bytes(self._operand_types(q_dtype)[2], cute.select(k_smem, MMA_MODES))
        pipes = self._pipelines(smem, q_dtype, q_smem, kv_tx_bytes)
        cute.arch.sync_threads()  # mbarrier inits and the TMEM address visible to every warp

        # -- shared memory and tensor memory --
        thr_mma_kq = kq_mma.get_slice(0)
        thr_mma_vp = vp_mma.get_slice(0)
        acc = cutlass.Float32
        # Running column max, double-buffered by tile parity: buffer s % 2 is written at tile s and
        # read right after a barrier; it is next written at tile s + 2, after the next barrier, so a
        # fast warp can never move the max a slow warp has yet to read.
        col_max_layout = cute.make_layout((MMA_M, n_tile), stride=(0, 1))
        sM0 = smem.allocate_tensor(acc, col_max_layout, 16)
        sM1 = smem.allocate_tensor(acc, col_max_layout, 16)
        sL = smem.allocate_tensor(
            acc, cute.make_layout((MMA_M, n_tile, WARPS_PER_WARPGROUP), stride=(0, 1, n_tile)), 16
        )
        tBsQ = smem.allocate_tensor(q_dtype, q_smem.outer, SWIZZLE_ALIGN, q_smem.inner)
        tAsK = smem.allocate_tensor(kv_stage_dtype, k_smem.outer, SWIZZLE_ALIGN, k_smem.inner)
        tAsV = cute.make_tensor(
            cute.recast_ptr(tAsK.iterator, v_smem.inner, dtype=kv_stage_dtype), v_smem.outer
        )  # V shares the ring
        sKVp = None
        if cutlass.const_expr(nvfp4):
            sKVp = smem.allocate_tensor(
                cutlass.Float4E2M1FN,
                cute.make_layout(
                    (TILE_KEYS, cfg.head_dim, dv.packed_stages), stride=(cfg.head_dim, 1, TILE_KEYS * cfg.head_dim)
                ),
                128,
            )
        # P: the (keys, rows) C tile of GEMM1 read as the (rows, keys) B tile of GEMM2.
        p_layout = sm100_utils.make_smem_layout_b(vp_mma, (None, n_tile, MMA_M), q_dtype, SP_STAGES)
        tBsP = smem.allocate_tensor(q_dtype, p_layout.outer, SWIZZLE_ALIGN, p_layout.inner)
        tBsP_nk = cute.local_tile(tBsP, thr_mma_vp.partition_shape_B((n_tile, MMA_K)), (0, 0, None, None))
        tCtS_shape = kq_mma.partition_shape_C((MMA_M, n_tile, SP_STAGES))
        tCsP = cute.composition(tBsP, cute.make_ordered_layout(tCtS_shape, order=((2, 0), 3, 1, 4)))
        # O (shape only; aliases the Q buffer, never written)
        sO = cute.make_tensor(cute.recast_ptr(tBsQ.iterator, o_smem.inner, dtype=acc), o_smem.outer)
        tCsO = thr_mma_vp.partition_C(sO)

        tmem = cute.arch.retrieve_tmem_ptr(cutlass.Int32, 16, tmem_holder)
        col = 0
        if cutlass.const_expr(fp8):
            tAK = thr_mma_kq.make_fragment_A(tAsK)
            tAV = thr_mma_vp.make_fragment_A(tAsV)
        else:
            # bf16 path: converted K/V stages live in TMEM (K and V stages share the columns)
            k_frag = thr_mma_kq.make_fragment_A(kq_mma.partition_shape_A((MMA_M, MMA_K, dv.cvt_stages)))
            v_frag = thr_mma_vp.make_fragment_A(vp_mma.partition_shape_A((MMA_M, MMA_K, dv.cvt_stages)))
            tAK = cute.make_tensor(cute.recast_ptr(tmem + col, dtype=q_dtype), k_frag.layout)
            tAV = cute.make_tensor(cute.recast_ptr(tmem + col, dtype=q_dtype), v_frag.layout)
            col += tcgen05.find_tmem_tensor_col_offset(tAK)
        tCtS = thr_mma_kq.make_fragment_C(tCtS_shape)
        tCtS = cute.make_tensor(cute.recast_ptr(tmem + col, dtype=acc), tCtS.layout)
        col += tcgen05.find_tmem_tensor_col_offset(tCtS)
        tCtO = thr_mma_vp.make_fragment_C(tCsO.shape)
        tCtO = cute.make_tensor(cute.recast_ptr(tmem + col, dtype=acc), tCtO.layout)
        col += tcgen05.find_tmem_tensor_col_offset(tCtO)
        assert col <= dv.tmem_cols, f"TMEM columns used {col} > allocated {dv.tmem_cols}"

        ctx = SimpleNamespace(
            seq=seq, tile_begin=tile_begin, n_iters=n_iters, slot=slot, kv_head=kv_head, h_k=h_k, n_q=n_q,
            hb=kv_head + h_k * seq, seq_len=mSeqLens[seq], n_splits=mNSplits[seq], q_tile_idx=q_tile_idx,
            num_pages=num_pages, q_dtype=q_dtype, kv_stage_dtype=kv_stage_dtype, tmem=tmem, tmem_holder=tmem_holder,
            kq_mma=kq_mma, vp_mma=vp_mma, thr_mma_kq=thr_mma_kq, thr_mma_vp=thr_mma_vp,
            q_atom=q_atom, k_atom=k_atom, v_atom=v_atom, mQ=mQ, mK=mK, mV=mV, mKS=mKS,
            mVS=mVS, mBT=mBT, mQD=mQD, mKD=mKD, mVD=mVD, mO=mO, mLSE=mLSE, mOp=mOp, mMp=mMp,
            mLp=mLp, tBsQ=tBsQ, tAsK=tAsK, tAsV=tAsV, sKVp=sKVp, tAK=tAK, tAV=tAV, tCtS=tCtS, tCtO=tCtO,
            tCsP=tCsP, tBsP_nk=tBsP_nk, tCsO=tCsO, sM0=sM0, sM1=sM1, sL=sL, scale_qs=scale_qs,
            scale_qs_log2_e=scale_qs_log2_e, scale_o=scale_o, p=pipes,
        )  # fmt: skip

        if idle:
            pass
        elif warp_idx == self.tma_kv_warp:
            self.load_kv(ctx)
        elif warp_idx == self.tma_q_warp:
            self.load_q(ctx)
        elif wg_idx >= self.cvt_wg_begin and wg_idx < self.cvt_wg_end:
            if cutlass.const_expr(nvfp4):
                self.convert_nvfp4(ctx)
            elif cutlass.const_expr(not fp8):
                self.convert_bf16(ctx, wg_idx - self.cvt_wg_begin)
        elif warp_idx == self.mma_kq_warp:
            self.mma_kq(ctx)
        elif warp_idx == self.mma_vp_warp:
            self.mma_vp(ctx)
        elif wg_idx == self.softmax_wg:
            self.softmax(ctx)
        return

    def _pipelines(self, smem, q_dtype, q_smem, kv_tx_bytes):
        """mbarrier pipelines between the roles (plain Python, traced inside the kernel)."""
        cfg = self.config
        dv = cfg.derived
        nvfp4 = cfg.kv_format == "nvfp4"
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        wg = pipeline.CooperativeGroup(pipeline.Agent.Thread, WARPGROUP_THREADS)
        no_mcast = cute.make_layout((1, 1, 1, 1))
        p = SimpleNamespace()
        storage = {
            "q": dv.q_stages,
            "pk": max(1, dv.packed_stages),
            "kv": dv.kv_stages,
            "cvt": max(1, dv.cvt_stages),
            "s": SP_STAGES,
            "p": SP_STAGES,
            "o": O_STAGES,
        }
        bars = {name: smem.allocate_array(cutlass.Int64, n * 2) for name, n in storage.items()}
        p.q_producer, p.q_consumer = pipeline.PipelineTmaAsync.create(
            num_stages=dv.q_stages, producer_group=one, consumer_group=wg,
            tx_count=cute.size_in_bytes(q_dtype, cute.select(q_smem, MMA_MODES)),
            barrier_storage=bars["q"], tidx=0, cta_layout_vmnk=no_mcast, defer_sync=True,
        ).make_participants()  # fmt: skip
        p.pk_producer = p.pk_consumer = p.cvt_producer = p.cvt_consumer = None
        if nvfp4:
            # TMA -> packed e2m1 tiles -> convert warpgroup -> e4m3 ring -> MMA
            p.pk_producer, p.pk_consumer = pipeline.PipelineTmaAsync.create(
                num_stages=dv.packed_stages, producer_group=one, consumer_group=wg,
                tx_count=TILE_KEYS * cfg.head_dim // 2, barrier_storage=bars["pk"], tidx=0,
                cta_layout_vmnk=no_mcast, defer_sync=True,
            ).make_participants()  # fmt: skip
            p.kv_producer, p.kv_consumer = pipeline.PipelineAsyncUmma.create(
                num_stages=dv.kv_stages, producer_group=wg, consumer_group=one, barrier_storage=bars["kv"],
                defer_sync=True,
            ).make_participants()  # fmt: skip
            p.a_consumer = p.kv_consumer
        elif cfg.fp8:
            # TMA -> ring -> MMA; a stage is released by the tcgen05.commit of the MMA that read it.
            # Out-of-bounds page boxes are zero-filled and still credit their bytes.
            p.kv_producer, p.kv_consumer = pipeline.PipelineTmaUmma.create(
                num_stages=dv.kv_stages, producer_group=one, consumer_group=one, tx_count=kv_tx_bytes,
                barrier_storage=bars["kv"], cta_layout_vmnk=no_mcast, defer_sync=True,
            ).make_participants()  # fmt: skip
            p.a_consumer = p.kv_consumer
        else:
            # TMA -> ring -> convert warpgroups (striding over stages) -> TMEM stages -> MMA
            p.kv_producer, p.kv_consumer = pipeline.PipelineTmaAsync.create(
                num_stages=dv.kv_stages, producer_group=one, consumer_group=wg, tx_count=kv_tx_bytes,
                barrier_storage=bars["kv"], tidx=0, cta_layout_vmnk=no_mcast, defer_sync=True,
            ).make_participants()  # fmt: skip
            p.cvt_producer, p.cvt_consumer = pipeline.PipelineAsyncUmma.create(
                num_stages=max(1, dv.cvt_stages), producer_group=wg, consumer_group=one,
                barrier_storage=bars["cvt"], defer_sync=True,
            ).make_participants()  # fmt: skip
            p.a_consumer = p.cvt_consumer
        p.s_producer, p.s_consumer = pipeline.PipelineUmmaAsync.create(
            num_stages=SP_STAGES, producer_group=one, consumer_group=wg, barrier_storage=bars["s"], defer_sync=True
        ).make_participants()
        p.p_producer, p.p_consumer = pipeline.PipelineAsyncUmma.create(
            num_stages=SP_STAGES, producer_group=wg, consumer_group=one, barrier_storage=bars["p"], defer_sync=True
        ).make_participants()
        p.o_producer, p.o_consumer = pipeline.PipelineUmmaAsync.create(
            num_stages=O_STAGES, producer_group=one, consumer_group=wg, barrier_storage=bars["o"], defer_sync=True
        ).make_participants()
        p.softmax_bar = pipeline.NamedBarrier(barrier_id=1, num_threads=WARPGROUP_THREADS)
        p.kq_bar = pipeline.NamedBarrier(barrier_id=2, num_threads=2 * WARP_THREADS)
        p.vp_bar = pipeline.NamedBarrier(barrier_id=3, num_threads=2 * WARP_THREADS)
        return p

    def _set_registers(self, target: int):
        """setmaxnreg for this warp role when the config re-balances registers (no-op otherwise)."""
        dv = self.config.derived
        if dv.reg_reconfig:
            if target < dv.launch_regs:
                cute.arch.setmaxregister_decrease(target)
            elif target > dv.launch_regs:
                cute.arch.setmaxregister_increase(target)

    # ------------------------------------------------------------------------------------------
    # Stage: TMA K/V (paged) and Q
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _page_coord(self, c, block: cutlass.Int32):
        """L-mode coordinate (kv head, page) of page `block` of this sequence; pages at or past the
        sequence end map to page index num_pages (out of bounds: TMA zero-fills and the block-table
        padding, which may hold garbage, is never read)."""
        page = c.num_pages
        if block * self.config.page_size < c.seq_len:
            page = c.mBT[c.seq, block]
        return c.kv_head + c.h_k * page

    @cute.jit
    def load_kv(self, c):
        cfg = self.config
        self._set_registers(cfg.derived.mma_tma_regs)
        # K/V are streamed once: EVICT_FIRST keeps Q, block table and partials in L2.
        hint = self._kv_cache_hint()
        if cutlass.const_expr(cfg.kv_format == "nvfp4"):
            self._load_kv_packed(c, hint)
        else:
            self._load_kv_ring(c, hint)

    def _kv_cache_hint(self):
        """TMA copy kwargs: the EVICT_FIRST L2 policy when configured (plain Python)."""
        if self.config.evict_first:
            return {"cache_policy": cutlass.Int64(EVICT_FIRST_POLICY)}
        return {}

    @cute.jit
    def _load_kv_ring(self, c, hint):
        """K of tile tile_begin + s and V of tile tile_begin + s - LEAD at step s, tiles_d stages each."""
        cfg = self.config
        ps = cfg.page_size
        pages_per_tile = TILE_KEYS // ps
        whole_page = ps == TILE_KEYS
        kv_producer = c.p.kv_producer.clone()
        atom_k = c.k_atom
        atom_v = c.v_atom
        if cutlass.const_expr(whole_page):
            gK = cute.local_tile(c.mK, tiler=(TILE_KEYS, cfg.head_dim), coord=(0, 0, None))
            gV = cute.local_tile(c.mV, tiler=(cfg.head_dim, TILE_KEYS), coord=(0, 0, None))
            tAgK = c.thr_mma_kq.partition_A(cute.flat_divide(gK, (MMA_M, MMA_K)))
            tAgV = c.thr_mma_vp.partition_A(cute.flat_divide(gV, (MMA_M, MMA_K)))
            sK, gK_t = cute.nvgpu.cpasync.tma_partition(
                atom_k, 0, cute.make_layout((1, 1, 1, 1)), cute.group_modes(c.tAsK, 0, 3), cute.group_modes(tAgK, 0, 3)
            )  # (TMA, stages), (TMA, 1, tiles_d, L)
            sV, gV_t = cute.nvgpu.cpasync.tma_partition(
                atom_v, 0, cute.make_layout((1, 1, 1, 1)), cute.group_modes(c.tAsV, 0, 3), cute.group_modes(tAgV, 0, 3)
            )  # (TMA, stages), (TMA, tiles_d, 1, L)
        else:
            # Logical (s, d, stage) / (d, s, stage) views of the ring, cut into one box per page.
            ring = cute.make_layout((MMA_M, MMA_K, cfg.derived.kv_stages), stride=(1, MMA_M, MMA_M * MMA_K))
            sK_box = cute.flat_divide(cute.composition(c.tAsK, ring), (ps, MMA_K))  # (PS, K, J, 1, stages)
            sV_box = cute.flat_divide(cute.composition(c.tAsV, ring), (MMA_M, ps))  # (M, PS, 1, J, stages)
            sK, gK_t = cute.nvgpu.cpasync.tma_partition(
                atom_k, 0, cute.make_layout((1, 1, 1, 1)), cute.group_modes(sK_box, 0, 2),
                cute.group_modes(cute.flat_divide(c.mK, (ps, MMA_K)), 0, 2),
            )  # (TMA, J, 1, stages), (TMA, 1, tiles_d, L)  # fmt: skip
            sV, gV_t = cute.nvgpu.cpasync.tma_partition(
                atom_v, 0, cute.make_layout((1, 1, 1, 1)), cute.group_modes(sV_box, 0, 2),
                cute.group_modes(cute.flat_divide(c.mV, (MMA_M, ps)), 0, 2),
            )  # (TMA, 1, J, stages), (TMA, tiles_d, 1, L)  # fmt: skip

        n_iters = c.n_iters
        tile_begin = c.tile_begin
        for s in cutlass.range(n_iters + LEAD):
            if s < n_iters:
                tile = tile_begin + s
                for dk in cutlass.range_constexpr(self.tiles_d):
                    h = kv_producer.acquire_and_advance()
                    for j in cutlass.range_constexpr(pages_per_tile):
                        coord = self._page_coord(c, tile * pages_per_tile + j)
                        if cutlass.const_expr(whole_page):
                            dst = sK[None, h.index]
                        else:
                            dst = sK[None, j, 0, h.index]
                        cute.copy(atom_k, gK_t[None, 0, dk, coord], dst, tma_bar_ptr=h.barrier, **hint)
            if s >= LEAD:
                tile = tile_begin + s - LEAD
                for dm in cutlass.range_constexpr(self.tiles_d):
                    h = kv_producer.acquire_and_advance()
                    for j in cutlass.range_constexpr(pages_per_tile):
                        coord = self._page_coord(c, tile * pages_per_tile + j)
                        if cutlass.const_expr(whole_page):
                            dst = sV[None, h.index]
                        else:
                            dst = sV[None, 0, j, h.index]
                        cute.copy(atom_v, gV_t[None, dm, 0, coord], dst, tma_bar_ptr=h.barrier, **hint)

    @cute.jit
    def _load_kv_packed(self, c, hint):
        """nvfp4: packed e2m1 K then V tiles (token-major, whole head dim), one box per page, into
        the packed ring the convert warpgroup drains; same K-ahead-of-V order as the ring."""
        cfg = self.config
        ps = cfg.page_size
        pages_per_tile = TILE_KEYS // ps
        box = (ps, cfg.head_dim)
        s_box = cute.group_modes(cute.flat_divide(c.sKVp, box), 0, 2)  # (box, J, 1, packed stages)
        sK, gK_t = cute.nvgpu.cpasync.tma_partition(
            c.k_atom, 0, cute.make_layout((1, 1, 1, 1)), s_box, cute.group_modes(cute.flat_divide(c.mK, box), 0, 2)
        )
        sV, gV_t = cute.nvgpu.cpasync.tma_partition(
            c.v_atom, 0, cute.make_layout((1, 1, 1, 1)), s_box, cute.group_modes(cute.flat_divide(c.mV, box), 0, 2)
        )
        pk_producer = c.p.pk_producer.clone()
        n_iters = c.n_iters
        tile_begin = c.tile_begin
        for s in cutlass.range(n_iters + LEAD):
            if s < n_iters:
                tile = tile_begin + s
                h = pk_producer.acquire_and_advance()
                for j in cutlass.range_constexpr(pages_per_tile):
                    coord = self._page_coord(c, tile * pages_per_tile + j)
                    cute.copy(c.k_atom, gK_t[None, 0, 0, coord], sK[None, j, 0, h.index], tma_bar_ptr=h.barrier, **hint)
            if s >= LEAD:
                tile = tile_begin + s - LEAD
                h = pk_producer.acquire_and_advance()
                for j in cutlass.range_constexpr(pages_per_tile):
                    coord = self._page_coord(c, tile * pages_per_tile + j)
                    cute.copy(c.v_atom, gV_t[None, 0, 0, coord], sV[None, j, 0, h.index], tma_bar_ptr=h.barrier, **hint)

    @cute.jit
    def load_q(self, c):
        cfg = self.config
        self._set_registers(cfg.derived.mma_tma_regs)
        gQ = cute.local_tile(c.mQ, tiler=(cfg.q_tile, cfg.head_dim), coord=(c.q_tile_idx, 0, c.hb))
        tBgQ = c.thr_mma_kq.partition_B(cute.flat_divide(gQ, (cfg.q_tile, MMA_K)))
        sQ, gQ_t = cute.nvgpu.cpasync.tma_partition(
            c.q_atom,
            0,
            cute.make_layout((1, 1, 1, 1)),
            cute.group_modes(c.tBsQ, 0, 3),
            cute.group_modes(tBgQ, 0, 3),
        )
        q_producer = c.p.q_producer.clone()
        for dk in cutlass.range_constexpr(self.tiles_d):  # q_stages == tiles_d
            h = q_producer.acquire_and_advance()
            cute.copy(c.q_atom, gQ_t[None, 0, dk], sQ[None, dk], tma_bar_ptr=h.barrier)

    # ------------------------------------------------------------------------------------------
    # Stage: convert warpgroups
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def convert_bf16(self, c, wg_rank):
        """bf16-Q path: e4m3 K/V stage (smem, ldmatrix) -> f32 -> bf16 -> TMEM A-operand stage.
        With several convert warpgroups each takes every n-th stage (rank wg_rank)."""
        cfg = self.config
        dv = cfg.derived
        self._set_registers(dv.convert_regs)
        groups = dv.convert_warpgroups
        q_dtype = c.q_dtype
        kv_dtype = c.kv_stage_dtype
        tid = cute.arch.thread_idx()[0] % WARPGROUP_THREADS
        kv_consumer = c.p.kv_consumer.clone()
        cvt_producer = c.p.cvt_producer.clone()
        if cutlass.const_expr(groups > 1):
            for _skip in cutlass.range(wg_rank):
                kv_consumer.advance()
                cvt_producer.advance()

        reps = tcgen05.Repetition(MMA_K * q_dtype.width // 256)
        st_k = tcgen05.make_tmem_copy(cute.make_copy_atom(tcgen05.St16x256bOp(reps), q_dtype), c.tAK[MMA_SLICE + (0,)])
        st_k_thr = st_k.get_slice(tid)
        ld_k_thr = cute.make_tiled_copy_S(
            cute.make_copy_atom(cute.nvgpu.warp.LdMatrix8x16x8bOp(num_matrices=4), kv_dtype), st_k
        ).get_slice(tid)
        st_v = tcgen05.make_tmem_copy(cute.make_copy_atom(tcgen05.St16x256bOp(reps), q_dtype), c.tAV[MMA_SLICE + (0,)])
        st_v_thr = st_v.get_slice(tid)
        ld_v_thr = cute.make_tiled_copy_S(
            cute.make_copy_atom(cute.nvgpu.warp.LdMatrix16x16x8bOp(transpose=True, num_matrices=2), kv_dtype), st_v
        ).get_slice(tid)
        # K of tile s and V of tile s - LEAD (the ring's order): e4m3 from shared memory -> bf16 into TMEM
        parts = (
            self._convert_part(ld_k_thr, st_k_thr, c.tAsK, c.tAK),
            self._convert_part(ld_v_thr, st_v_thr, c.tAsV, c.tAV),
        )

        n_iters = c.n_iters
        for s in cutlass.range(n_iters + LEAD):
            active = (s < n_iters, s >= LEAD)
            for which in cutlass.range_constexpr(2):
                ld_thr, st_thr, s_thr, t_thr, r_shape, r16_shape = parts[which]
                if active[which]:
                    for _stage in cutlass.range(self.tiles_d // groups, unroll=2):
                        r8 = cute.make_rmem_tensor(r_shape, kv_dtype)
                        r16 = cute.make_rmem_tensor(r16_shape, q_dtype)
                        src = kv_consumer.wait_and_advance()
                        cute.copy(ld_thr, s_thr[CPY_SLICE + (src.index,)], r8)
                        cute.arch.fence_view_async_shared()
                        src.release()
                        r16.store(r8.load().to(cutlass.Float32).to(q_dtype).reshape(r16_shape))
                        dst = cvt_producer.acquire_and_advance()
                        cute.copy(st_thr, r16, t_thr[CPY_SLICE + (dst.index,)])
                        cute.arch.fence_view_async_tmem_store()
                        dst.commit()
                        for _other in cutlass.range_constexpr(groups - 1):
                            kv_consumer.advance()
                            cvt_producer.advance()

    @staticmethod
    def _convert_part(ld_thr, st_thr, smem, tmem):
        """One operand (K or V) of ``convert_bf16``: its copies, the partitions of its shared-memory and TMEM
        stages, and the register shapes (trace-time only)."""
        return (ld_thr, st_thr, ld_thr.partition_S(smem), st_thr.partition_D(tmem), ld_thr.partition_D(smem).shape[:-1],
                st_thr.partition_S(tmem).shape[:-1])  # fmt: skip

    @cute.jit
    def convert_nvfp4(self, c):
        """nvfp4: packed (token, d) e2m1 tile -> e4m3(code * fp32(scale) * 2^-3) into the e4m3 ring
        stages the fp8 MMA reads (K (s, d) K-major, V (d, s) MN-major, both through logical views).
        Thread t owns chunk t % (d/32) (32 codes = 2 scale groups) of rows t // (d/32) + k * rows_per_pass;
        a warp reads consecutive 16-B chunks (conflict-free); a chunk lands in stage chunk // 4."""
        cfg = self.config
        dv = cfg.derived
        self._set_registers(dv.convert_regs)
        ps = cfg.page_size
        pages_per_tile = TILE_KEYS // ps
        tid = cute.arch.thread_idx()[0] % WARPGROUP_THREADS
        chunks = cfg.head_dim // NVFP4_CHUNK
        rows_per_pass = WARPGROUP_THREADS // chunks
        chunk = tid % chunks
        row0 = tid // chunks
        chunks_per_stage = MMA_K // NVFP4_CHUNK
        stage_of_chunk = chunk // chunks_per_stage
        chunk_in_stage = chunk % chunks_per_stage
        ring = cute.make_layout((MMA_M, MMA_K, dv.kv_stages), stride=(1, MMA_M, MMA_M * MMA_K))
        sK_sd = cute.composition(c.tAsK, ring)  # (s, d, stage)
        sV_ds = cute.composition(c.tAsV, ring)  # (d, s, stage)
        shift = cutlass.Float32(NVFP4_SHIFT)
        pk_consumer = c.p.pk_consumer.clone()
        kv_producer = c.p.kv_producer.clone()
        n_iters = c.n_iters
        tile_begin = c.tile_begin
        for s in cutlass.range(n_iters + LEAD):
            for which in cutlass.range_constexpr(2):  # 0: K tile, 1: V tile
                active = s < n_iters
                tile = tile_begin + s
                if cutlass.const_expr(which == 1):
                    active = s >= LEAD
                    tile = tile_begin + s - LEAD
                if active:
                    src = pk_consumer.wait_and_advance()
                    first = kv_producer.acquire_and_advance()
                    stage = first.index
                    rest = []
                    for k in cutlass.range_constexpr(1, self.tiles_d):
                        h = kv_producer.acquire_and_advance()
                        rest.append(h)
                        if stage_of_chunk == k:
                            stage = h.index
                    for i in cutlass.range(TILE_KEYS // rows_per_pass, unroll=2):
                        row = row0 + rows_per_pass * i
                        self._convert_nvfp4_chunk(
                            c, which, tile * pages_per_tile + row // ps, row, chunk, chunk_in_stage,
                            c.sKVp[row, None, src.index], sK_sd, sV_ds, stage, shift,
                        )  # fmt: skip
                    cute.arch.fence_view_async_shared()  # generic-proxy smem writes -> tcgen05 reads
                    src.release()
                    first.commit()
                    for h in rest:
                        h.commit()

    @cute.jit
    def _convert_nvfp4_chunk(self, c, which, block, row, chunk, chunk_in_stage, packed_row, sK_sd, sV_ds, stage, shift):
        """One row chunk: 2 e4m3 scales from global memory, 32 e2m1 codes from smem, 32 e4m3 out.
        Rows past the sequence end were zero-filled by TMA (code 0 -> 0); their scales come from page 0."""
        cfg = self.config
        ps = cfg.page_size
        page = 0
        if block * ps < c.seq_len:
            page = c.mBT[c.seq, block]
        coord = c.kv_head + c.h_k * page
        scales8 = cute.make_rmem_tensor((2,), cutlass.Float8E4M3FN)
        if cutlass.const_expr(which == 0):
            cute.autovec_copy(cute.local_tile(c.mKS[row % ps, None, coord], (2,), (chunk,)), scales8)
        else:
            cute.autovec_copy(cute.local_tile(c.mVS[row % ps, None, coord], (2,), (chunk,)), scales8)
        scales = cute.make_rmem_tensor((2,), cutlass.Float32)
        scales.store(scales8.load().to(cutlass.Float32))
        lo = scales[0] * shift
        hi = scales[1] * shift
        codes = cute.make_rmem_tensor((NVFP4_CHUNK,), cutlass.Float4E2M1FN)
        cute.autovec_copy(cute.local_tile(packed_row, (NVFP4_CHUNK,), (chunk,)), codes)
        vals = cute.make_rmem_tensor((NVFP4_CHUNK,), cutlass.Float32)
        vals.store(codes.load().to(cutlass.Float32))
        for j in cutlass.range_constexpr(NVFP4_CHUNK):
            if cutlass.const_expr(j < NVFP4_GROUP):
                vals[j] = vals[j] * lo
            else:
                vals[j] = vals[j] * hi
        out = cute.make_rmem_tensor((NVFP4_CHUNK,), c.q_dtype)
        out.store(vals.load().to(c.q_dtype))
        if cutlass.const_expr(which == 0):
            cute.autovec_copy(out, cute.local_tile(sK_sd[row, None, stage], (NVFP4_CHUNK,), (chunk_in_stage,)))
        else:
            cute.autovec_copy(out, cute.local_tile(sV_ds[None, row, stage], (NVFP4_CHUNK,), (chunk_in_stage,)))

    # ------------------------------------------------------------------------------------------
    # Stage: MMA warps
    # ------------------------------------------------------------------------------------------
    def _mma_warp_start(self, c):
        """What both MMA warps start with: their register budget, then (their clone of the K/V ring's
        consumer state, the barrier GEMM1 -> GEMM2, the barrier GEMM2 -> GEMM1). Trace-time only."""
        self._set_registers(self.config.derived.mma_tma_regs)
        return c.p.a_consumer.clone(), c.p.kq_bar, c.p.vp_bar

    @cute.jit
    def mma_kq(self, c):
        """GEMM1 per tile: S[stage] = K . Q over tiles_d stages; then hand over to GEMM2."""
        a_consumer, kq_bar, vp_bar = self._mma_warp_start(c)
        tiled_mma, tCtS, tAK = c.kq_mma, c.tCtS, c.tAK
        q_frag = c.thr_mma_kq.make_fragment_B(c.tBsQ)
        q_consumer = c.p.q_consumer.clone()
        s_producer = c.p.s_producer.clone()
        for _ in cutlass.range_constexpr(self.tiles_d):
            q_consumer.wait_and_advance()
        s_token = cutlass.Boolean(True)  # the producer acquires first
        for s in cutlass.range(c.n_iters):
            k_token = a_consumer.try_wait()
            tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
            s_h = s_producer.acquire_and_advance(s_token)
            for dk in cutlass.range_constexpr(self.tiles_d):
                k_h = a_consumer.wait_and_advance(k_token)
                if cutlass.const_expr(dk == self.tiles_d - 1):
                    kq_bar.arrive()  # GEMM2 of the previous tile may start
                for kb in cutlass.range_constexpr(cute.size(tAK, mode=[2])):
                    cute.gemm(
                        tiled_mma,
                        tCtS[MMA_SLICE + (s_h.index,)],
                        tAK[None, None, kb, k_h.index],
                        q_frag[None, None, kb, dk],
                        tCtS[MMA_SLICE + (s_h.index,)],
                    )
                    if cutlass.const_expr(dk == 0 and kb == 0):
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                k_h.release()
                if cutlass.const_expr(dk < self.tiles_d - 1):
                    k_token = a_consumer.try_wait()
            s_h.commit()
            if s > 0:
                for _ in cutlass.range_constexpr(self.tiles_d):  # V stages belong to the GEMM2 warp
                    a_consumer.advance()
                vp_bar.arrive_and_wait()
                s_token = s_producer.try_acquire()

    @cute.jit
    def mma_vp(self, c):
        """GEMM2 per tile: O += V . P, accumulating in TMEM; then frees TMEM at the end."""
        a_consumer, kq_bar, vp_bar = self._mma_warp_start(c)
        tiled_mma, tCtO, tAV = c.vp_mma, c.tCtO, c.tAV
        p_frag = c.thr_mma_vp.make_fragment_B(c.tBsP_nk)
        p_consumer = c.p.p_consumer.clone()
        o_producer = c.p.o_producer.clone()
        n_iters = c.n_iters
        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
        for _ in cutlass.range_constexpr(self.tiles_d):  # K stages of tile 0 belong to the GEMM1 warp
            a_consumer.advance()
        kq_bar.arrive_and_wait()
        p_token = cutlass.Boolean(False)
        o_token = cutlass.Boolean(True)
        for s in cutlass.range(n_iters):
            if s < n_iters - 1:
                for _ in cutlass.range_constexpr(self.tiles_d):
                    a_consumer.advance()
                kq_bar.arrive_and_wait()
                p_token = p_consumer.try_wait()
            v_token = a_consumer.try_wait()
            p_h = p_consumer.wait_and_advance(p_token)
            o_h = o_producer.acquire_and_advance(o_token)
            for dm in cutlass.range_constexpr(self.tiles_d):
                v_h = a_consumer.wait_and_advance(v_token)
                if cutlass.const_expr(dm == self.tiles_d - 1):
                    vp_bar.arrive()  # GEMM1 of the next-but-one tile may start
                for kb in cutlass.range_constexpr(cute.size(tAV, mode=[2])):
                    cute.gemm(
                        tiled_mma,
                        tCtO[MMA_SLICE + (dm, 0)],
                        tAV[None, None, kb, v_h.index],
                        p_frag[None, None, kb, 0, p_h.index],
                        tCtO[MMA_SLICE + (dm, 0)],
                    )
                v_h.release()
                if cutlass.const_expr(dm < self.tiles_d - 1):
                    v_token = a_consumer.try_wait()
            p_h.release()
            o_h.commit()
            o_token = o_producer.try_acquire()
        o_producer.tail()  # the softmax's last O read is done
        cute.arch.relinquish_tmem_alloc_permit()
        cute.arch.dealloc_tmem(c.tmem, self.config.derived.tmem_cols)

    # ------------------------------------------------------------------------------------------
    # Stage: softmax warpgroup (thread t = key row t of a tile = head-dim row t of O)
    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _exp_reference(self, m):
        """Exponent reference of a column: its running max, 0 while no key is visible (-inf), so
        p = exp2(-inf) = 0 instead of NaN from (-inf) - (-inf)."""
        ref = m
        if m == -cutlass.Float32.inf:
            ref = cutlass.Float32(0.0)
        return ref

    @cute.jit
    def _mask_scores(self, scores, key_row, seq_len, n_base, h_r):
        """Keys at or past seq_len are -inf; causal q_len > 1: column n (query qi = n // h_r) sees
        keys 0 .. seq_len - q_len + qi, i.e. is masked when n < (key_row - seq_len + q_len) * h_r."""
        cfg = self.config
        if cutlass.const_expr(cfg.q_len == 1 or not cfg.causal):
            if key_row >= seq_len:
                scores.fill(-cutlass.Float32.inf)
        else:
            first_visible = (key_row - seq_len + cfg.q_len) * h_r - n_base  # columns below are masked
            for i in cutlass.range_constexpr(cute.size(scores)):
                if i < first_visible:
                    scores[i] = -cutlass.Float32.inf

    @cute.jit
    def softmax(self, c):
        cfg = self.config
        dv = cfg.derived
        self._set_registers(dv.softmax_regs)
        n_tile = cfg.q_tile
        acc = cutlass.Float32
        q_dtype = c.q_dtype
        tid = cute.arch.thread_idx()[0] % WARPGROUP_THREADS
        lane = cute.arch.lane_idx()
        warp = (cute.arch.thread_idx()[0] // WARP_THREADS) % WARPS_PER_WARPGROUP
        lane_owns_col = n_tile == WARP_THREADS or lane < n_tile  # lane i keeps column i's statistics
        n_base = c.q_tile_idx * n_tile
        h_r = c.n_q // cfg.q_len

        # q/k descales fold into the exponent scale (S is only max'ed and exponentiated), v into O.
        qk_descale = c.mQD[c.hb] * c.mKD[c.hb]
        exp_scale = c.scale_qs_log2_e * qk_descale
        lse_scale = c.scale_qs * qk_descale
        v_descale = c.mVD[c.hb]

        reps = tcgen05.Repetition(n_tile * acc.width // 32)
        ld_s = tcgen05.make_tmem_copy(cute.make_copy_atom(tcgen05.Ld32x32bOp(reps), acc), c.tCtS[MMA_SLICE + (0,)])
        ld_s_thr = ld_s.get_slice(tid)
        st_o_thr = tcgen05.make_tmem_copy(
            cute.make_copy_atom(tcgen05.St32x32bOp(reps), acc), c.tCtO[MMA_SLICE + (0, 0)]
        ).get_slice(tid)
        tStS = ld_s_thr.partition_S(c.tCtS)
        tSsP = ld_s_thr.partition_D(c.tCsP)
        tStO = ld_s_thr.partition_S(c.tCtO)
        tSsO = ld_s_thr.partition_D(c.tCsO)
        tSsM0 = ld_s_thr.partition_D(c.thr_mma_kq.partition_C(c.sM0))
        tSsM1 = ld_s_thr.partition_D(c.thr_mma_kq.partition_C(c.sM1))
        tSsL = ld_s_thr.partition_D(c.thr_mma_kq.partition_C(c.sL))

        m_prev = cute.make_rmem_tensor_like(tSsM0)  # running column max after the previous tile
        m_prev.fill(-acc.inf)
        row_sum = cute.make_rmem_tensor_like(tSsL[CPY_SLICE + (0,)])  # this thread's key row, per column
        row_sum.fill(acc(0))

        o_regs = cute.make_rmem_tensor_like(tSsO)
        o_regs.fill(acc(0))
        cute.copy(st_o_thr, o_regs, tStO)  # O = 0
        if warp == 0 and lane_owns_col:
            tSsM0[lane] = -acc.inf
            tSsM1[lane] = -acc.inf
        c.p.softmax_bar.arrive_and_wait()

        s_consumer = c.p.s_consumer.clone()
        p_producer = c.p.p_producer.clone()
        o_consumer = c.p.o_consumer.clone()
        softmax_bar = c.p.softmax_bar
        n_iters = c.n_iters
        tile_begin = c.tile_begin
        seq_len = c.seq_len
        p_scale = acc(cfg.p_scale)
        for s in cutlass.range(n_iters):
            key_row = (tile_begin + s) * TILE_KEYS + tid
            s_h = s_consumer.wait_and_advance()
            scores = cute.make_rmem_tensor(tSsP.shape[:-1], acc)
            cute.copy(ld_s, tStS[CPY_SLICE + (s_h.index,)], scores)
            cute.arch.fence_view_async_tmem_load()
            s_h.release()
            self._mask_scores(scores, key_row, seq_len, n_base, h_r)

            # Column max of this tile over the warp, merged with the running max into this
            # tile's buffer; after the barrier every thread reads the same running max m.
            m = cute.make_rmem_tensor_like(tSsM0)
            lane_max = acc(0)
            for i in cutlass.range_constexpr(cute.size(scores)):
                m[i] = _warp_fmax(scores[i])
                if i == lane:
                    lane_max = cute.arch.fmax(m[i], m_prev[i], nan=True)
            if lane_owns_col:
                if s % 2 == 0:
                    _smem_fmax(tSsM0.iterator + tSsM0.layout(lane), lane_max)
                else:
                    _smem_fmax(tSsM1.iterator + tSsM1.layout(lane), lane_max)
            softmax_bar.arrive_and_wait()
            if s % 2 == 0:
                cute.autovec_copy(tSsM0, m)
            else:
                cute.autovec_copy(tSsM1, m)

            # p = exp2((S - m_ref) * c) in place, then P = e4m3(p * 448) or bf16(p) to smem.
            for i in cutlass.range_constexpr(0, cute.size(scores), 2):
                x = _add2((scores[i], scores[i + 1]), (-self._exp_reference(m[i]), -self._exp_reference(m[i + 1])))
                x = _mul2(x, (exp_scale, exp_scale))
                scores[i] = _exp2(x[0])
                scores[i + 1] = _exp2(x[1])
            p_regs = cute.make_rmem_tensor(tSsP.shape[:-1], q_dtype)
            if cutlass.const_expr(cfg.fp8):
                p_regs.store((scores.load() * p_scale).to(q_dtype))
            else:
                p_regs.store(scores.load().to(q_dtype))
            p_h = p_producer.acquire_and_advance()
            cute.autovec_copy(p_regs, tSsP[CPY_SLICE + (p_h.index,)])
            cute.arch.fence_view_async_shared()  # generic smem writes -> tcgen05 reads
            p_h.commit()

            # corr = exp2((m_prev - m_ref) * c); row sum l = fma(corr, l, p) over the unrounded p.
            corr = cute.make_rmem_tensor_like(m)
            rescale = cutlass.Boolean(False)
            for i in cutlass.range_constexpr(0, cute.size(m), 2):
                x = _add2((m_prev[i], m_prev[i + 1]), (-self._exp_reference(m[i]), -self._exp_reference(m[i + 1])))
                x = _mul2(x, (exp_scale, exp_scale))
                cc = (_exp2(x[0]), _exp2(x[1]))
                corr[i] = cc[0]
                corr[i + 1] = cc[1]
                lsum = _fma2(cc, (row_sum[i], row_sum[i + 1]), (scores[i], scores[i + 1]))
                row_sum[i] = lsum[0]
                row_sum[i + 1] = lsum[1]
                if m[i] != m_prev[i] or m[i + 1] != m_prev[i + 1]:
                    rescale = cutlass.Boolean(True)

            # Rescale O only when some column max moved (corr is exactly 1 otherwise, so skipping
            # is bit-identical); m is shared, so the test is uniform over the warpgroup.
            if s > 0:
                o_h = o_consumer.wait_and_advance()
                if rescale:
                    for dm in cutlass.range_constexpr(self.tiles_d):
                        o_dm = cute.make_rmem_tensor_like(tSsO[CPY_SLICE + (0, 0)])
                        cute.copy(ld_s_thr, tStO[CPY_SLICE + (dm, 0)], o_dm)
                        cute.arch.fence_view_async_tmem_load()  # tcgen05.wait::ld before reading o_dm
                        for i in cutlass.range_constexpr(0, cute.size(o_dm), 2):
                            y = _mul2((o_dm[i], o_dm[i + 1]), (corr[i], corr[i + 1]))
                            o_dm[i] = y[0]
                            o_dm[i + 1] = y[1]
                        cute.copy(st_o_thr, o_dm, tStO[CPY_SLICE + (dm, 0)])
                    cute.arch.fence_view_async_tmem_store()
                o_h.release()
            m_prev.store(m.load())

        self._epilogue(c, o_consumer, ld_s_thr, tStO, o_regs, row_sum, tSsL, lane, warp, lane_owns_col, n_base,
                       lse_scale, v_descale)  # fmt: skip

    @cute.jit
    def _epilogue(self, c, o_consumer, ld_s_thr, tStO, o_regs, row_sum, tSsL, lane, warp, lane_owns_col, n_base,
                  lse_scale, v_descale):  # fmt: skip
        """Row statistics and O: l = butterfly sum over the warp's lanes (xor 16..1), then
        w0 + w1 + w2 + w3 over the warps; unsplit: bf16(O * (out_scale / (l + 1e-30))) and
        lse = m * lse_scale + log(l); split: fp32 partials O * v_descale / p_scale, m, l."""
        cfg = self.config
        acc = cutlass.Float32
        single = cfg.max_splits == 1
        lane_sum = acc(0)
        for i in cutlass.range_constexpr(cute.size(row_sum)):
            row_sum[i] = cute.arch.warp_reduction_sum(row_sum[i])
            if i == lane:
                lane_sum = row_sum[i]
        if lane_owns_col:
            tSsL[CPY_SLICE + (warp,)][lane] = lane_sum
        c.p.softmax_bar.arrive_and_wait()

        sL = c.sL
        mLSE = c.mLSE
        mMp = c.mMp
        mLp = c.mLp
        mO = c.mO
        mOp = c.mOp
        hb = c.hb
        slot = c.slot
        n_q = c.n_q
        n_splits = c.n_splits
        last_parity = (c.n_iters - 1) % 2
        col = n_base + lane
        if warp == 0 and lane_owns_col and col < n_q:
            l_total = sL[0, lane, 0] + sL[0, lane, 1] + sL[0, lane, 2] + sL[0, lane, 3]
            m_raw = c.sM0[0, lane]
            if last_parity == 1:
                m_raw = c.sM1[0, lane]
            m_out = mul_rn(m_raw, lse_scale)  # -inf stays -inf; rounded before the add (never an fma)
            if cutlass.const_expr(single):
                mLSE[col, hb] = m_out + cute.math.log(l_total, fastmath=False)
            else:
                if n_splits == 1:
                    mLSE[col, hb] = m_out + cute.math.log(l_total, fastmath=False)
                else:
                    mMp[col, hb, slot] = m_out
                    mLp[col, hb, slot] = l_total

        o_h = o_consumer.wait_and_advance()
        cute.copy(ld_s_thr, tStO, o_regs)
        cute.arch.fence_view_async_tmem_load()
        o_h.release()  # the last O read: the GEMM2 warp may free TMEM

        # Thread t holds head-dim row dm * 128 + t of every column: each store instruction of the
        # warpgroup writes 128 consecutive d values.
        inv_p_scale = acc(1.0 / cfg.p_scale)
        out_scale = c.scale_o * v_descale * inv_p_scale
        part_scale = v_descale * inv_p_scale
        tid = cute.arch.thread_idx()[0] % WARPGROUP_THREADS
        write_final = cutlass.Boolean(True)
        if cutlass.const_expr(not single):
            write_final = n_splits == 1
        if write_final:
            norm = cute.make_rmem_tensor((cfg.q_tile,), acc)
            for i in cutlass.range_constexpr(cfg.q_tile):
                # + 1e-30: an empty row (seq_len 0) has l = 0 and O = 0 and writes 0, not NaN;
                # otherwise l >= 1 and the addition is exact in fp32.
                norm[i] = out_scale / (sL[0, i, 0] + sL[0, i, 1] + sL[0, i, 2] + sL[0, i, 3] + acc(1e-30))
            for dm in cutlass.range_constexpr(self.tiles_d):
                o_dm = o_regs[CPY_SLICE + (dm, 0)]
                d_idx = dm * MMA_M + tid
                for i in cutlass.range_constexpr(cute.size(o_dm)):
                    if n_base + i < n_q:
                        mO[d_idx, n_base + i, hb] = mO.element_type(o_dm[i] * norm[i])
        else:
            for dm in cutlass.range_constexpr(self.tiles_d):
                o_dm = o_regs[CPY_SLICE + (dm, 0)]
                d_idx = dm * MMA_M + tid
                for i in cutlass.range_constexpr(cute.size(o_dm)):
                    if n_base + i < n_q:
                        mOp[d_idx, n_base + i, hb, slot] = o_dm[i] * part_scale
