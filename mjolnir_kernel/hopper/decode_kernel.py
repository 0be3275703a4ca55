"""Paged decode attention for Hopper (sm_90a): device code only.

One CTA of eight warps (twelve with converter warps, below) per (work item, 16-row query tile, KV head); a
work item (seq, tile_begin, tile_end, slot) of the split plan is a contiguous range of 128-key tiles that the
CTA streams front to back through a cp.async ring of two tiles (three with converter warps at d = 128; pages
at or past the sequence end are zero-filled, not read; the loads mark their L2 lines evict-first: KV is read
once). Per tile, the eight warps:

  1. S = Q.K^T for 16 keys each (warp w: keys 16w .. 16w + 15), mma.m16n8k16 with fp32 accumulate;
     K's fp8 bytes come from shared memory by ``ldmatrix`` and are widened exactly in registers;
  2. mask, per-warp row max -> smem -> the tile's row max, merged with the running max (raw S units);
  3. p = ex2((S - m) * c), the row sums l = fma(corr, l, p) per key slot over the unrounded p, and
     P (e4m3(p * 448) or bf16(p)) to shared memory;
  4. O = O * corr + P.V for a d / 8 slice of the head dim each (warp w: d in [w d/8, (w+1) d/8)),
     V's bytes by ``ldmatrix.trans`` regrouped into key pairs and widened exactly.

Exactness of the MMA inputs: on the e4m3-Q path Q, K, V and P = e4m3(p * 448) are e4m3 values, all
exactly f16, so the f16 MMA multiplies exactly what the fp8 MMA would; on the bf16-Q path K and V are
widened to bf16 (exact). Each tile's products go into fp32 accumulators (no contraction longer than a
tile). The head-dim order inside one MMA is a relabeling (the sum is order-free in the spec's model):
``ldmatrix`` hands thread (g, c) K bytes 4c .. 4c + 3 of key g's 16-byte chunk (head dims d = 4c .. 4c + 3),
which feed the MMA's k positions 2c, 2c + 1, 2c + 8, 2c + 9; Q is loaded in the same order.

Sub-byte formats: the ring holds the packed rows (and NVFP4's block-scale rows), converted to e4m3 bytes
that steps 1-4 read as they read e4m3 KV. e2m1, e3m2 and e2m3 codes become e4m3 bytes of value * 2^-k by
placing their bits (``scaled_kv``; Q and P carry the 2^k, so every product is the same); NVFP4 codes are
looked up in a table of the block's eight e4m3(m * scale / 8), built once per 16 codes (``ptx.py``). Who
converts depends on the format (``HopperConfig``):

- fp6 at d = 128 and NVFP4 (``converters``): four more warps (``_converter_loop``) keep the packed ring full
  and convert each tile's K and V into one of two pairs of e4m3 tiles, handing the pairs to the eight MMA
  warps by named barriers (FULL / EMPTY per pair); the MMA warps run the e4m3 path on them. One CTA per SM.
  Every k-step of S adds head dims 16 s .. 16 s + 15, as for e4m3.
- e2m1, and fp6 at d = 256 (``k_registers``): the eight warps convert V into a tile buffer after the tile
  lands, and K skips the tile: in step 1 each lane (g, c) loads its keys' packed bytes c d / 4 .. (c + 1)
  d / 4 (head dims in the same relabeling freedom as above; Q is loaded in that order) and converts them
  straight into its fragments; the row-max barrier of step 2 also completes the V tile (converted before
  K's codes at d = 128, after the QK MMAs are issued at d = 256: ``HopperConfig.v_late``). For e2m1
  (``HopperConfig.overlap``) step 4 of tile i runs between the barriers of steps 1-2 of tile i + 1, with two
  e4m3 V tiles (``_overlap_step``): two block barriers per tile, not three.

Each of these choices was measured faster than its alternative (the ``HopperConfig`` docstring says where).

Row sums follow the Thor kernel's order exactly: one running sum per key slot of the tile (a TMEM lane
there), combined at the end with the same butterfly tree over each 32 keys (key xor 16, 8, 4, 2, 1)
and the four 32-key sums added left to right. The arithmetic, stage by stage, is the spec's
(``mjolnir_numerics.emulator_stages``; docs/numerics.md); ``mjolnir_numerics.emulate_decode`` models it.

Tensors (element strides from ``mjolnir_kernel.host``): Q (b, h_k, n_q, d) packed rows with a free
sequence stride; K/V logical (pages, PS, h_k, d) views of any layout with d contiguous; O like Q (bf16);
LSE (b, h_k, n_q) fp32; partials o/m/l (splits, b, h_k, n_q[, d]) fp32.
"""

from types import SimpleNamespace


import cutlass
import cutlass.cute as cute
import cutlass.memory

from mjolnir_numerics.formats import FORMATS

from ..kernel_views import DecodeEntry, shared_views
from ..reduction import LOG2_E, SplitReduction, mul_rn
from .config import P_ROW_PAD, Q_TILE, THREADS, TILE_KEYS, WARPS, HopperConfig, can_implement_hopper
from .ptx import (
    l2_evict_first_policy,
    cp_async_8,
    cp_async_16,
    e2m1x8_to_e4m3x8,
    e2m1x8_to_e4m3x8_scaled,
    nvfp4_block_table,
    fp6x16_to_e4m3x16_scaled,
    f16x2_times_pow2,
    SCALED_KV_EXPONENT,
    ld_shared_b32,
    ld_shared_u8,
    ld_shared_v2_b32,
    ld_shared_v4_b32,
    ld_shared_v4_f32,
    prmt,
    st_shared_v4_b32,
    e4m3x4_to_pairs,
    e4m3x4_to_pairs_transposed,
    f32x2_to_bf16_pair,
    f32x2_to_e4m3_pair,
    ld_global_b32,
    ld_global_v2_b32,
    ldmatrix_x4,
    mma_m16n8k16,
    st_global_v2_b32,
    st_global_v4_f32,
    st_shared_b32,
    ld_shared_f32,
    st_shared_f32,
)

CHUNK = 16  # bytes per cp.async / per ldmatrix row (16 e4m3 values)
P_ROW_BYTES = (TILE_KEYS + P_ROW_PAD) * 2
KEYS_PER_WARP = TILE_KEYS // WARPS  # 16: two n = 8 MMA blocks of S per warp
NB_S = KEYS_PER_WARP // 8
PV_KSTEPS = TILE_KEYS // 16
# Named barriers of a CTA with converter warps (``HopperConfig.converters``; 0 is unused: it would wait for all
# the CTA's threads)
BAR_MMA = 1  # the eight MMA warps (the block barrier of the kernel without converters)
BAR_CONVERTERS = 2  # the converter warps
BAR_FULL = 3  # + e4m3 tile pair i: converted (converters arrive, MMA warps wait)
BAR_EMPTY = 5  # + e4m3 tile pair i: read (MMA warps arrive, converters wait)
CONVERTED_PAIRS = 2


def _fmax(a, b):
    return cute.arch.fmax(a, b, nan=True)


class HopperDecodeKernel(DecodeEntry):
    """The Hopper decode kernel for one ``HopperConfig``; ``__call__`` takes the Thor kernel's arguments
    (``mjolnir_kernel.host.launch_args``)."""

    def __init__(self, config: HopperConfig):
        can_implement_hopper(config)
        self.config = config
        d = config.head_dim
        self.d = d
        self.chunks = d // CHUNK  # 16-byte chunks per key row
        self.s_ksteps = d // 16  # k-steps of S = Q.K^T
        self.d_warp = d // WARPS  # head-dim slice of one warp in P.V
        self.pv_chunks = self.d_warp // CHUNK  # 16-wide head-dim chunks per warp (2 n-blocks each)
        self.stages = config.ring_stages
        self.pages_per_tile = max(1, TILE_KEYS // config.page_size)
        self.fmt = FORMATS[config.kv_format]
        self.ring_tile_bytes = TILE_KEYS * config.ring_row_bytes  # one K (or V) ring stage
        self.scale_tile_bytes = TILE_KEYS * (config.head_dim // 16)  # NVFP4 scales of one K (or V) tile
        self.tile_bytes = config.tile_bytes
        self.launch_extra = {"use_pdl": True} if config.pdl else {}
        # q_tile 8: the MMA tile's rows 8-15 are padding (n_q <= 8); each thread's softmax, row sums and
        # O rescale cover its row g only, and P's rows 8-15 stay zero
        self.halves = 1 if config.q_tile == 8 else 2
        # K in registers: lane (g, c) of a warp converts bytes c * k_span .. + k_span of its keys' packed
        # rows (d / 4 codes: head dims c d / 4 .. (c + 1) d / 4 - 1) into its MMA fragments
        self.k_regs = config.k_registers
        # the serial loop of a packed format (fp6 at d = 256) converts V after the QK MMAs; e2m1 overlaps
        assert not config.packed or config.converters or config.overlap or config.v_late, config
        self.k_span = config.packed_row_bytes // 4 if config.packed else 0
        # scaled e2m1: V's e4m3 tile holds each 8 head dims as the even ones, then the odd ones (no byte
        # permutes); O's columns come out in that order and are put back once after the loop
        self.v_even_odd = config.scaled_kv and config.kv_format == "e2m1"
        self.converters = config.converters
        self.converter_threads = 32 * config.converter_warps
        self.all_threads = THREADS + self.converter_threads
        self.reduction = None
        if config.max_splits > 1:
            self.reduction = SplitReduction(config.max_splits, config.pdl)

    @cute.jit
    def launch(self, problem_shape, max_blocks, num_pages, num_work, strides, ptrs, scale_qs, scale_o, stream):
        """The grids of one call (traced inside ``DecodeEntry.__call__``, the launch signature)."""
        b, h_k, n_q, d = problem_shape
        (q_seq, o_seq, k_page, k_row, k_head, v_page, v_row, v_head, _qd_seq, _qd_head, _kd_seq, _kd_head,
         _vd_seq, _vd_head, ks_page, ks_row, ks_head, vs_page, vs_row, vs_head) = strides  # fmt: skip
        v = shared_views(problem_shape, max_blocks, self.config.max_splits, strides, ptrs)
        v.work = cute.make_tensor(ptrs.work, cute.make_layout((num_work, 4), stride=(4, 1)))
        # Q, K, V, O, the o partials and NVFP4 scales are addressed from their base pointers and strides.
        base = cute.make_layout((1,))
        v.q, v.k, v.v = cute.make_tensor(ptrs.q, base), cute.make_tensor(ptrs.k, base), cute.make_tensor(ptrs.v, base)
        v.o, v.o_part = cute.make_tensor(ptrs.o, base), cute.make_tensor(ptrs.o_part, base)
        v.k_scales, v.v_scales = cute.make_tensor(ptrs.k_scales, base), cute.make_tensor(ptrs.v_scales, base)
        self.kernel(
            v.q, v.k, v.v, v.k_scales, v.v_scales, v.block_table, v.seq_lens, v.work, v.n_splits, v.q_descale,
            v.k_descale, v.v_descale, v.o, v.lse, v.o_part, v.m_part, v.l_part, b, h_k, n_q, q_seq, o_seq, k_page,
            k_row, k_head, v_page, v_row, v_head, ks_page, ks_row, ks_head, vs_page, vs_row, vs_head, scale_qs,
            scale_qs * LOG2_E, scale_o,
        ).launch(
            grid=(num_work, cute.ceil_div(n_q, Q_TILE), h_k),
            block=[self.config.threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=self.config.ctas_per_sm,  # the plan counts on this many CTAs per SM
            **self.launch_extra,
        )  # fmt: skip

        self.launch_reduction(ptrs, v.n_splits, problem_shape, strides, scale_o, stream)

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mKS: cute.Tensor,
        mVS: cute.Tensor,
        mBT: cute.Tensor,
        mSeqLens: cute.Tensor,
        mWork: cute.Tensor,
        mNSplits: cute.Tensor,
        mQD: cute.Tensor,
        mKD: cute.Tensor,
        mVD: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mOp: cute.Tensor,
        mMp: cute.Tensor,
        mLp: cute.Tensor,
        b: cutlass.Int32,
        h_k: cutlass.Int32,
        n_q: cutlass.Int32,
        q_seq: cutlass.Int32,
        o_seq: cutlass.Int32,
        k_page: cutlass.Int32,
        k_row: cutlass.Int32,
        k_head: cutlass.Int32,
        v_page: cutlass.Int32,
        v_row: cutlass.Int32,
        v_head: cutlass.Int32,
        ks_page: cutlass.Int32,
        ks_row: cutlass.Int32,
        ks_head: cutlass.Int32,
        vs_page: cutlass.Int32,
        vs_row: cutlass.Int32,
        vs_head: cutlass.Int32,
        scale_qs: cutlass.Float32,
        scale_qs_log2_e: cutlass.Float32,
        scale_o: cutlass.Float32,
    ):
        cfg = self.config
        f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
        d = self.d

        # PDL: wait for the previous grid (Q / KV writes, an earlier reduction reading the partials)
        # before the first global access; then let the reduction launch and wait for us in turn.
        if cutlass.const_expr(cfg.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        work_idx, q_tile_idx, head = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(tid // 32)
        lane = tid % 32
        g = lane // 4
        c = lane % 4

        seq = mWork[work_idx, 0]
        tile_begin = mWork[work_idx, 1]
        tile_end = mWork[work_idx, 2]
        slot = mWork[work_idx, 3]
        n_iters = tile_end - tile_begin
        if n_iters > 0:  # padding work items (CUDA-graph padded lists) exit at once
            seq_len = mSeqLens[seq]
            hb = head + h_k * seq  # linear index into the (h_k, b) mode
            n_base = q_tile_idx * Q_TILE
            h_r = n_q // cfg.q_len

            smem = cutlass.memory.SmemAllocator()
            ring = self._ring(smem, mK, mV, mKS, mVS, head, k_page, k_row, k_head, v_page, v_row, v_head, ks_page,
                              ks_row, ks_head, vs_page, vs_row, vs_head)  # fmt: skip
            p_buf = smem.allocate_array(cutlass.Uint8, Q_TILE * P_ROW_BYTES, byte_alignment=128).toint()
            # (warp, row) at row * WARPS + warp: a row's eight warp maxima are two 16-byte vectors
            s_max = smem.allocate_tensor(f32, cute.make_layout((WARPS, Q_TILE), stride=(1, WARPS)), 16)
            s_sum = smem.allocate_tensor(f32, cute.make_layout((WARPS, Q_TILE), stride=(Q_TILE, 1)), 16)
            s_max_addr = s_max.iterator.toint()
            if cutlass.const_expr(self.halves == 1):  # P rows 8-15 (padding) are zero for every tile
                pad_words = 8 * P_ROW_BYTES // 4
                for i in cutlass.range_constexpr((pad_words + THREADS - 1) // THREADS):
                    if tid < THREADS and tid + i * THREADS < pad_words:
                        st_shared_b32(p_buf + 8 * P_ROW_BYTES + 4 * (tid + i * THREADS), i32(0))

            is_mma_warp = True
            if cutlass.const_expr(self.converters):  # warps 8 and up load and convert; 0-7 are the MMA warps
                is_mma_warp = warp < WARPS
                if warp >= WARPS:
                    self._converter_loop(ring, tile_begin, n_iters, seq, seq_len, mBT, tid - THREADS)
            if is_mma_warp:
                # -- Q fragments (once): row g / g + 8 of this tile, head-dim order 4c .. 4c + 3 per k-step.
                qf = cute.make_rmem_tensor((self.s_ksteps * 4,), i32)
                q_row0 = i64(seq) * i64(q_seq) + (i64(head) * i64(n_q) + i64(n_base)) * i64(d)
                q_bytes = 1 if cfg.fp8 else 2
                q_base = mQ.iterator.toint()
                for half in cutlass.range_constexpr(2):
                    row = g + 8 * half
                    valid_row = n_base + row < n_q
                    for s in cutlass.range_constexpr(self.s_ksteps):
                        q_lo = i32(0)
                        q_hi = i32(0)
                        if valid_row:
                            addr = q_base + (q_row0 + i64(row * d + s * 16 + 4 * c)) * q_bytes
                            if cutlass.const_expr(cfg.fp8):
                                q4 = i32(0)
                                if cutlass.const_expr(self.k_regs):  # the head dims of K's k-step s in lane c
                                    q4 = self._q_in_k_order(q_base + q_row0 + i64(row * d), s, c)
                                else:
                                    q4 = ld_global_b32(addr)
                                q_lo, q_hi = e4m3x4_to_pairs(q4, bf16=False)
                                if cutlass.const_expr(cfg.scaled_kv):  # K holds k * 2^-kx: q * 2^kx keeps q k
                                    q_lo = f16x2_times_pow2(q_lo, SCALED_KV_EXPONENT[cfg.kv_format])
                                    q_hi = f16x2_times_pow2(q_hi, SCALED_KV_EXPONENT[cfg.kv_format])
                            else:
                                q_lo, q_hi = ld_global_v2_b32(addr)
                        qf[s * 4 + half] = q_lo
                        qf[s * 4 + 2 + half] = q_hi

                # -- descales folded as in the Thor kernel
                qk_descale = mQD[hb] * mKD[hb]
                exp_scale = scale_qs_log2_e * qk_descale
                lse_scale = scale_qs * qk_descale
                v_descale = mVD[hb]

                # -- running state
                m_prev = cute.make_rmem_tensor((2,), f32)
                m_prev.fill(-f32.inf)
                row_sum = cute.make_rmem_tensor((4 * NB_S,), f32)  # [j*4+i]: key 8j + 2c + (i & 1), row g + 8 (i >> 1)
                row_sum.fill(f32(0))
                o_acc = cute.make_rmem_tensor((self.pv_chunks * 2 * 4,), f32)
                o_acc.fill(f32(0))

                pages = cute.make_rmem_tensor((self.pages_per_tile,), i32)
                if cutlass.const_expr(not self.converters):  # else the converter warps load the ring
                    self._ring_prologue(ring, pages, tile_begin, n_iters, seq, seq_len, mBT, tid)

                p_scale = f32(cfg.p_scale)
                mask_from = self._mask_from(seq_len)
                t = SimpleNamespace(
                    qf=qf, s_max=s_max, s_max_addr=s_max_addr, p_buf=p_buf, m_prev=m_prev, row_sum=row_sum, o_acc=o_acc,
                    exp_scale=exp_scale, p_scale=p_scale, seq_len=seq_len, mask_from=mask_from, n_base=n_base, h_r=h_r,
                    warp=warp, lane=lane, g=g, c=c, tid=tid,
                )  # fmt: skip
                if cutlass.const_expr(self.converters):
                    for it in cutlass.range(n_iters, unroll=1):
                        pair = it % CONVERTED_PAIRS
                        # tile it converted
                        cute.arch.barrier(barrier_id=BAR_FULL + pair, number_of_threads=self.all_threads)
                        k_stage = ring.k_conv + pair * self.tile_bytes
                        v_stage = ring.v_conv + pair * self.tile_bytes
                        sacc = cute.make_rmem_tensor((4 * NB_S,), f32)
                        self._qk(sacc, t, k_stage)
                        self._row_max(sacc, t, tile_begin + it)
                        self._sync()
                        self._softmax(sacc, t)
                        self._sync()
                        self._pv(o_acc, p_buf, v_stage, warp, lane)
                        if it + CONVERTED_PAIRS < n_iters:  # the converters wait for this pair's next use
                            cute.arch.barrier_arrive(barrier_id=BAR_EMPTY + pair, number_of_threads=self.all_threads)
                elif cutlass.const_expr(cfg.overlap):
                    sacc = cute.make_rmem_tensor((4 * NB_S,), f32)
                    self._overlap_prologue(ring, pages, t, sacc, tile_begin, n_iters, seq, mBT)
                    for it in cutlass.range(n_iters - 1, unroll=1):
                        self._overlap_step(ring, pages, t, sacc, it, tile_begin, n_iters, seq, mBT)
                    cute.arch.cp_async_wait_group(0)
                    self._sync()
                    v_last = ring.v_conv + ((n_iters - 1) % 2) * self.tile_bytes
                    self._pv(o_acc, p_buf, v_last, warp, lane)  # the last tile's P.V
                else:
                    for it in cutlass.range(n_iters, unroll=1):
                        k_stage, v_stage = self._ring_next(ring, pages, it, tile_begin, n_iters, seq, seq_len, mBT, tid)
                        sacc = cute.make_rmem_tensor((4 * NB_S,), f32)
                        self._qk(sacc, t, k_stage)
                        if cutlass.const_expr(cfg.v_late):  # V's tile, while the QK MMAs are in flight
                            st = self._packed_stage(ring, it % self.stages)
                            self._convert_tiles(None, st.v, None, ring.v_conv, None, st.v_scales, tid)
                        self._row_max(sacc, t, tile_begin + it)
                        self._sync()
                        self._softmax(sacc, t)
                        self._sync()
                        self._pv(o_acc, p_buf, v_stage, warp, lane)

                if cutlass.const_expr(self.v_even_odd):
                    self._o_in_natural_order(o_acc, c)
                cute.arch.cp_async_wait_group(0)
                self._epilogue(
                    row_sum, m_prev, o_acc, s_sum, ring.k_ring, mO, mLSE, mOp, mMp, mLp, mNSplits, seq, slot, hb, head,
                    b, h_k, n_q, n_base, o_seq, lse_scale, v_descale, scale_o, warp, g, c,
                )  # fmt: skip

    # -- the phases of one tile (steps 1-4 of the module docstring); ``t``: the CTA's state (kernel) -------
    @cute.jit
    def _qk(self, sacc, t, k_stage):
        """1. S for keys 16 warp + 0..15 of the tile into ``sacc`` (two n = 8 blocks): from the e4m3 tile at
        ``k_stage`` by ldmatrix (one per two k-steps), or with K in registers from the packed ring
        stage ``k_stage`` straight into the fragments."""
        f32 = cutlass.Float32
        bf16_mma = not self.config.fp8
        qf, warp, lane, g, c = t.qf, t.warp, t.lane, t.g, t.c
        sacc.fill(f32(0))
        key_ld = warp * KEYS_PER_WARP + (lane % 8) + 8 * ((lane // 8) % 2)
        if cutlass.const_expr(self.k_regs):  # this warp's packed K codes straight into fragments
            kw = []
            for j in cutlass.range_constexpr(NB_S):
                kw.append(self._k_words(k_stage, warp * KEYS_PER_WARP + 8 * j + g, c))
            for s in cutlass.range_constexpr(self.s_ksteps):
                a = (qf[s * 4], qf[s * 4 + 1], qf[s * 4 + 2], qf[s * 4 + 3])
                for j in cutlass.range_constexpr(NB_S):
                    b0, b1 = e4m3x4_to_pairs(kw[j][s], bf16=False)
                    cc = (sacc[j * 4], sacc[j * 4 + 1], sacc[j * 4 + 2], sacc[j * 4 + 3])
                    r = mma_m16n8k16(a, (b0, b1), cc, bf16=False)
                    for e in cutlass.range_constexpr(4):
                        sacc[j * 4 + e] = r[e]
        for s2 in cutlass.range_constexpr(0 if self.k_regs else self.s_ksteps // 2):
            chunk = 2 * s2 + lane // 16
            kr = ldmatrix_x4(self._kv_row(k_stage, key_ld, chunk, lane & 7))
            for ss in cutlass.range_constexpr(2):
                s = 2 * s2 + ss
                a = (qf[s * 4], qf[s * 4 + 1], qf[s * 4 + 2], qf[s * 4 + 3])
                for j in cutlass.range_constexpr(NB_S):
                    b0, b1 = e4m3x4_to_pairs(kr[2 * ss + j], bf16=bf16_mma)
                    cc = (sacc[j * 4], sacc[j * 4 + 1], sacc[j * 4 + 2], sacc[j * 4 + 3])
                    r = mma_m16n8k16(a, (b0, b1), cc, bf16=bf16_mma)
                    for e in cutlass.range_constexpr(4):
                        sacc[j * 4 + e] = r[e]

    @cute.jit
    def _row_max(self, sacc, t, tile):
        """2. Mask tile ``tile``'s scores in ``sacc`` and store this warp's row maxima to ``t.s_max`` (the
        caller's block barrier makes them the tile's)."""
        f32 = cutlass.Float32
        cfg = self.config
        warp, g, c = t.warp, t.g, t.c
        # (a tile whose keys every row sees needs no mask: all but the last one or two)
        if (tile + 1) * TILE_KEYS > t.mask_from:
            key0 = tile * TILE_KEYS + warp * KEYS_PER_WARP + 2 * c
            for j in cutlass.range_constexpr(NB_S):
                for e in cutlass.range_constexpr(2 * self.halves):
                    key = key0 + 8 * j + (e & 1)
                    masked = key >= t.seq_len
                    if cutlass.const_expr(cfg.q_len > 1 and cfg.causal):
                        qi = (t.n_base + g + 8 * (e >> 1)) // t.h_r
                        masked = masked or key > t.seq_len - cfg.q_len + qi
                    if masked:
                        sacc[j * 4 + e] = -f32.inf
        mx = cute.make_rmem_tensor((2,), f32)
        for half in cutlass.range_constexpr(self.halves):
            x = sacc[2 * half]
            x = _fmax(x, sacc[2 * half + 1])
            for j in cutlass.range_constexpr(1, NB_S):
                x = _fmax(x, sacc[j * 4 + 2 * half])
                x = _fmax(x, sacc[j * 4 + 2 * half + 1])
            for off in (1, 2):
                x = _fmax(x, cute.arch.shuffle_sync_bfly(x, offset=off, mask=0xFFFFFFFF))
            mx[half] = x
        if c == 0:
            t.s_max[warp, g] = mx[0]
            if cutlass.const_expr(self.halves == 2):
                t.s_max[warp, g + 8] = mx[1]

    @cute.jit
    def _softmax(self, sacc, t):
        """3. Running max, p, corr, row sums, P to shared memory, and O *= corr (after the row-max barrier)."""
        f32 = cutlass.Float32
        g, c, warp = t.g, t.c, t.warp
        m_prev, row_sum, o_acc = t.m_prev, t.row_sum, t.o_acc
        m_use = cute.make_rmem_tensor((2,), f32)
        corr = cute.make_rmem_tensor((2,), f32)
        corr.fill(f32(1.0))
        for half in cutlass.range_constexpr(self.halves):
            m_use[half], corr[half] = self._running_max(m_prev, half, t.s_max_addr, g + 8 * half, t.exp_scale)
        for j in cutlass.range_constexpr(NB_S):
            for e in cutlass.range_constexpr(2 * self.halves):
                p = cute.math.exp2((sacc[j * 4 + e] - m_use[e >> 1]) * t.exp_scale, fastmath=True)
                sacc[j * 4 + e] = p
                row_sum[j * 4 + e] = cute.math.fma(corr[e >> 1], row_sum[j * 4 + e], p)
            for half in cutlass.range_constexpr(self.halves):
                p_lo = sacc[j * 4 + 2 * half]
                p_hi = sacc[j * 4 + 2 * half + 1]
                pp = self._p_pair(p_lo, p_hi, t.p_scale)
                prow = g + 8 * half
                pcol = warp * KEYS_PER_WARP + 8 * j + 2 * c
                st_shared_b32(t.p_buf + prow * P_ROW_BYTES + pcol * 2, pp)
        # O *= corr only where a row max moved (corr == 1 elsewhere: skipping is bit-identical)
        if cute.arch.vote_any_sync(corr[0] != f32(1.0) or corr[1] != f32(1.0)):
            for i in cutlass.range_constexpr(cute.size(o_acc)):
                if cutlass.const_expr((i % 4) >> 1 < self.halves):
                    o_acc[i] = o_acc[i] * corr[(i % 4) >> 1]

    @cute.jit
    def _running_max(self, m_prev, i, s_max_addr, row, exp_scale):
        """Query row ``row``'s running max after this tile (m_prev[i] and the eight warp maxima of ``s_max``,
        raw S units; max is exact, so any order), stored back into m_prev[i]. Returns (m_use: the new max, 0
        where it is -inf; corr = exp2((m_prev - m_use) * exp_scale))."""
        f32 = cutlass.Float32
        m_new = m_prev[i]
        for v4 in cutlass.range_constexpr(WARPS // 4):
            w4 = ld_shared_v4_f32(s_max_addr + (row * WARPS + 4 * v4) * 4)
            for k in cutlass.range_constexpr(4):
                m_new = _fmax(m_new, w4[k])
        ref = m_new
        if m_new == -f32.inf:
            ref = f32(0.0)
        corr = cute.math.exp2((m_prev[i] - ref) * exp_scale, fastmath=True)
        m_prev[i] = m_new
        return ref, corr

    @cute.jit
    def _p_pair(self, p_lo, p_hi, p_scale):
        """Two unrounded p as the P.V operand's 16-bit pair: e4m3(p * 448) widened to f16 (times 2^k with
        ``scaled_kv``: V holds v * 2^-k, so p v is kept) on the e4m3-Q path, bf16(p) on the bf16 path."""
        cfg = self.config
        pp = cutlass.Int32(0)
        if cutlass.const_expr(cfg.fp8):
            pp = f32x2_to_e4m3_pair(p_lo * p_scale, p_hi * p_scale)
            if cutlass.const_expr(cfg.scaled_kv):
                pp = f16x2_times_pow2(pp, SCALED_KV_EXPONENT[cfg.kv_format])
        else:
            pp = f32x2_to_bf16_pair(p_lo, p_hi)
        return pp

    @cute.jit
    def _pv(self, o_acc, p_buf, v_stage, warp, lane):
        """4. O += P.V on this warp's head-dim slice (d / 8: one or two 16-wide chunks), V from the e4m3 tile
        at ``v_stage``, P from ``p_buf``. (Explicit arguments, not the kernel's namespace: the tracer rebinds
        a namespace's values inside the loop's branches, so after the loop only plain locals are valid.)"""
        bf16_mma = not self.config.fp8
        p_row = (lane % 8) + 8 * ((lane // 8) % 2)
        p_col = 8 * (lane // 16)
        if cutlass.const_expr(self.pv_chunks == 2):
            v_key = (lane % 8) + 8 * ((lane // 8) % 2)
            chunk = warp * 2 + lane // 16
            for ks in cutlass.range_constexpr(PV_KSTEPS):
                pa = ldmatrix_x4(p_buf + p_row * P_ROW_BYTES + (ks * 16 + p_col) * 2)
                key = ks * 16 + v_key
                vr = ldmatrix_x4(self._kv_row(v_stage, key, chunk, key & 7), trans=True)
                for cc_i in cutlass.range_constexpr(2):  # matrices (keys 0-7 | 8-15) of chunk cc_i
                    self._pv_chunk(o_acc, 2 * cc_i, pa, vr[2 * cc_i], vr[2 * cc_i + 1], bf16_mma)
        else:
            for ks2 in cutlass.range_constexpr(PV_KSTEPS // 2):
                key = ks2 * 32 + lane  # matrices: keys +0-7, +8-15 (k-step 2 ks2), +16-23, +24-31
                vr = ldmatrix_x4(self._kv_row(v_stage, key, warp, key & 7), trans=True)
                for sub in cutlass.range_constexpr(2):
                    ks = 2 * ks2 + sub
                    pa = ldmatrix_x4(p_buf + p_row * P_ROW_BYTES + (ks * 16 + p_col) * 2)
                    self._pv_chunk(o_acc, 0, pa, vr[2 * sub], vr[2 * sub + 1], bf16_mma)

    @cute.jit
    def _overlap_prologue(self, ring, pages, t, sacc, tile_begin, n_iters, seq, mBT):
        """The overlapped schedule (``HopperConfig.overlap``), before the loop (``_overlap_step``): the last
        ring stage's load, tile 0's V tile, S, row max and softmax (its P to shared memory)."""
        tid, stages = t.tid, self.stages
        # the ring's prologue put tiles 0 .. stages - 2 in flight; the last stage takes tile stages - 1
        if stages - 1 < n_iters:
            self._load(ring, stages - 1, tile_begin + stages - 1, pages, tid)
        cute.arch.cp_async_commit_group()
        if stages < n_iters:
            self._load_pages(pages, tile_begin + stages, seq, t.seq_len, mBT)
        cute.arch.cp_async_wait_group(stages - 1)
        self._sync()
        self._scores_overlapped(ring, sacc, t, tile_begin, 0)
        self._sync()
        self._softmax(sacc, t)

    @cute.jit
    def _overlap_step(self, ring, pages, t, sacc, it, tile_begin, n_iters, seq, mBT):
        """The overlapped schedule: iteration ``it`` (0 .. n_iters - 2; the last tile's P.V follows the loop) of
        the tile loop, with P.V of tile ``it`` and S of tile ``it`` + 1 between the same two block barriers, so
        one warp's instruction stream holds both (the serial loop runs them between different barriers):

          barrier X (tile it + 1 landed; P and V's e4m3 tile of tile it complete) -> refill tile it's ring
          stage with tile it + stages -> O += P.V of tile it, V of tile it + 1 into the other e4m3 V tile,
          its S and warp row maxima -> barrier Y -> its softmax (P to shared memory, O *= corr)

        The same operations on the same values, in the same order per accumulator, as the serial loop (the
        same bits); it costs a second e4m3 V tile of shared memory."""
        tid, stages = t.tid, self.stages
        cute.arch.cp_async_wait_group(stages - 2)
        self._sync()
        nxt = it + stages
        if nxt < n_iters:
            self._load(ring, it % stages, tile_begin + nxt, pages, tid)
        cute.arch.cp_async_commit_group()
        if nxt + 1 < n_iters:
            self._load_pages(pages, tile_begin + nxt + 1, seq, t.seq_len, mBT)
        self._pv(t.o_acc, t.p_buf, ring.v_conv + (it % 2) * self.tile_bytes, t.warp, t.lane)
        self._scores_overlapped(ring, sacc, t, tile_begin, it + 1)
        self._sync()
        self._softmax(sacc, t)

    @cute.jit
    def _scores_overlapped(self, ring, sacc, t, tile_begin, i):
        """Tile i of the overlapped schedule: V's codes into e4m3 V tile i % 2 (before or after the QK
        MMAs: ``HopperConfig.v_late``), S into ``sacc``, the warp row maxima."""
        st = self._packed_stage(ring, i % self.stages)
        v_tile = ring.v_conv + (i % 2) * self.tile_bytes
        if cutlass.const_expr(not self.config.v_late):
            self._convert_tiles(None, st.v, None, v_tile, None, st.v_scales, t.tid)
        self._qk(sacc, t, st.k)
        if cutlass.const_expr(self.config.v_late):
            self._convert_tiles(None, st.v, None, v_tile, None, st.v_scales, t.tid)
        self._row_max(sacc, t, tile_begin + i)

    @cute.jit
    def _o_in_natural_order(self, o_acc, c):
        """``v_even_odd``: V's tile held head dims 8h + 0, 2, 4, 6, 1, 3, 5, 7 at positions 8h + 0 .. 7, so
        lane c's four O columns per 16-wide chunk (the epilogue's d = 16 chunk + 4c + k, k = 0 .. 3) hold dims
        8h + 2k (c even) or 8h + 2k + 1 (c odd) of group h = 2 chunk + c // 2. Lanes c and c ^ 1 trade two
        values per row so that they hold 8h + 0 .. 3 and 8h + 4 .. 7, as with V in natural order. A
        relabeling of registers: no value changes."""
        odd = (c % 2) == 1
        for ch in cutlass.range_constexpr(self.pv_chunks):
            for half in cutlass.range_constexpr(self.halves):
                ev = (2 * ch) * 4 + 2 * half
                od = (2 * ch + 1) * 4 + 2 * half
                idx = (ev, od, ev + 1, od + 1)  # k = 0 .. 3 (the epilogue's order)
                v0, v1, v2, v3 = o_acc[idx[0]], o_acc[idx[1]], o_acc[idx[2]], o_acc[idx[3]]
                # even lane: dims 0, 2 | 4, 6 (keeps 0, 2); odd lane: dims 1, 3 | 5, 7 (keeps 5, 7)
                s0, s1 = v2, v3
                if odd:
                    s0, s1 = v0, v1
                r0 = cute.arch.shuffle_sync_bfly(s0, offset=1, mask=0xFFFFFFFF)
                r1 = cute.arch.shuffle_sync_bfly(s1, offset=1, mask=0xFFFFFFFF)
                n0, n1, n2, n3 = v0, r0, v1, r1  # even lane: dims 0, 1, 2, 3
                if odd:
                    n0, n1, n2, n3 = r0, v2, r1, v3  # odd lane: dims 4, 5, 6, 7
                o_acc[idx[0]], o_acc[idx[1]], o_acc[idx[2]], o_acc[idx[3]] = n0, n1, n2, n3

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _pv_chunk(self, o_acc, nb, pa, v_lo, v_hi, bf16_mma):
        """O n-blocks nb (even head-dim columns of a 16-wide chunk) and nb + 1 (odd ones) += P.V for one
        k-step; v_lo / v_hi: ldmatrix.trans registers of keys 0-7 / 8-15 of the k-step."""
        ev0, od0 = e4m3x4_to_pairs_transposed(v_lo, bf16=bf16_mma)
        ev1, od1 = e4m3x4_to_pairs_transposed(v_hi, bf16=bf16_mma)
        for par in cutlass.range_constexpr(2):
            bb = (ev0, ev1) if par == 0 else (od0, od1)
            base = (nb + par) * 4
            cc = (o_acc[base], o_acc[base + 1], o_acc[base + 2], o_acc[base + 3])
            r = mma_m16n8k16(pa, bb, cc, bf16=bf16_mma)
            for e in cutlass.range_constexpr(4):
                o_acc[base + e] = r[e]

    def _kv_row(self, tile, key, chunk, swizzle):
        """Shared address of 16-byte chunk ``chunk`` of key row ``key`` of an e4m3 K or V tile: at (key,
        chunk ^ swizzle) with ``swizzle`` = key & 7 (the XOR swizzle that puts the eight rows of an
        ldmatrix on distinct banks). Trace-time only."""
        return tile + key * self.d + ((chunk ^ swizzle) * CHUNK)

    def _sync(self):
        """The MMA warps' block barrier: ``bar.sync 0`` over the CTA, or with converter warps a named barrier
        over the eight MMA warps only. Trace-time only."""
        if self.converters:
            cute.arch.barrier(barrier_id=BAR_MMA, number_of_threads=THREADS)
        else:
            cute.arch.sync_threads()

    # -- the converter warps (``HopperConfig.converters``) ------------------------------------------------------
    @cute.jit
    def _converter_loop(self, ring, tile_begin, n_iters, seq, seq_len, mBT, ctid):
        """Warps 8 and up (``ctid`` 0 .. 32 converter_warps - 1): keep the packed ring full and convert tile
        ``it`` into e4m3 tile pair ``it % 2`` (K and V, the swizzled layout the e4m3 path reads), once the MMA
        warps are done with the pair's previous tile (``BAR_EMPTY``); then tell them it is there
        (``BAR_FULL``). The MMA warps run the e4m3 path on the pairs (``_sync`` over eight warps only)."""
        all_threads, n_conv = self.all_threads, self.converter_threads
        pages = cute.make_rmem_tensor((self.pages_per_tile,), cutlass.Int32)
        self._ring_prologue(ring, pages, tile_begin, n_iters, seq, seq_len, mBT, ctid, n_conv)
        for it in cutlass.range(n_iters, unroll=1):
            nxt = it + self.stages - 1
            cute.arch.cp_async_wait_group(self.stages - 2)
            # tile it landed for every converter, and each is done reading tile it - 1's stage: refill it
            cute.arch.barrier(barrier_id=BAR_CONVERTERS, number_of_threads=n_conv)
            if nxt < n_iters:
                self._load(ring, nxt % self.stages, tile_begin + nxt, pages, ctid, n_conv)
            cute.arch.cp_async_commit_group()
            if nxt + 1 < n_iters:
                self._load_pages(pages, tile_begin + nxt + 1, seq, seq_len, mBT)
            pair = it % CONVERTED_PAIRS
            if it >= CONVERTED_PAIRS:  # the MMA warps are past tile it - 2, which this pair held
                cute.arch.barrier(barrier_id=BAR_EMPTY + pair, number_of_threads=all_threads)
            st = self._packed_stage(ring, it % self.stages)
            k_tile = ring.k_conv + pair * self.tile_bytes
            v_tile = ring.v_conv + pair * self.tile_bytes
            # more than 8 groups a thread and tile (d = 256, four warps): K, then V, half the words live at once
            # (NVFP4 spilled with both)
            if cutlass.const_expr(TILE_KEYS * self.d // CHUNK > 8 * n_conv):
                self._convert_tiles(st.k, None, k_tile, None, st.k_scales, None, ctid, n_conv)
                self._convert_tiles(None, st.v, None, v_tile, None, st.v_scales, ctid, n_conv)
            else:
                self._convert_tiles(st.k, st.v, k_tile, v_tile, st.k_scales, st.v_scales, ctid, n_conv)
            cute.arch.barrier_arrive(barrier_id=BAR_FULL + pair, number_of_threads=all_threads)
        cute.arch.cp_async_wait_group(0)

    # -- the KV ring ---------------------------------------------------------------------------------
    def _ring(self, smem, mK, mV, mKS, mVS, head, k_page, k_row, k_head, v_page, v_row, v_head, ks_page, ks_row,
              ks_head, vs_page, vs_row, vs_head) -> SimpleNamespace:  # fmt: skip
        """Allocate the KV ring's shared memory (stages of K and V; for packed formats the converted e4m3
        K and V tiles, and NVFP4's block-scale rows) and bundle it with this CTA's global addressing: what
        ``_ring_prologue`` and ``_ring_next`` use. Trace-time only (no runtime control flow)."""
        i64 = cutlass.Int64
        ring_bytes = self.stages * self.ring_tile_bytes
        k_ring = smem.allocate_array(cutlass.Uint8, ring_bytes, byte_alignment=128).toint()
        v_ring = smem.allocate_array(cutlass.Uint8, ring_bytes, byte_alignment=128).toint()
        k_conv = k_ring  # the e4m3 tile the MMAs read (the ring stage itself for e4m3)
        v_conv = v_ring
        if self.config.packed:
            if self.converters:  # two e4m3 K tiles (K in registers needs none)
                k_conv = smem.allocate_array(cutlass.Uint8, CONVERTED_PAIRS * self.tile_bytes, byte_alignment=128)
                k_conv = k_conv.toint()
            # two e4m3 V tiles for the converters' pairs and the overlapped schedule (V of tile i and i + 1)
            v_tiles = CONVERTED_PAIRS if self.converters or self.config.overlap else 1
            v_conv = smem.allocate_array(cutlass.Uint8, v_tiles * self.tile_bytes, byte_alignment=128).toint()
        ks_ring = k_ring  # NVFP4 block scales of each ring stage: (keys, d / 16) bytes for K, then V
        if self.config.kv_format == "nvfp4":
            ks_ring = smem.allocate_array(cutlass.Uint8, 2 * self.stages * self.scale_tile_bytes, byte_alignment=16)
            ks_ring = ks_ring.toint()
        return SimpleNamespace(
            policy=l2_evict_first_policy(),
            k_ring=k_ring, v_ring=v_ring, k_conv=k_conv, v_conv=v_conv, ks_ring=ks_ring,
            k_base=mK.iterator.toint(), v_base=mV.iterator.toint(),
            head_k_off=i64(head) * i64(k_head) * self.fmt.bits // 8,  # element strides -> bytes
            head_v_off=i64(head) * i64(v_head) * self.fmt.bits // 8,
            k_page=k_page, k_row=k_row, v_page=v_page, v_row=v_row,
            # NVFP4 scale tensors: base addresses and (page, row) strides, the head folded in
            sc=SimpleNamespace(
                k_base=mKS.iterator.toint() + i64(head) * i64(ks_head), k_page=ks_page, k_row=ks_row,
                v_base=mVS.iterator.toint() + i64(head) * i64(vs_head), v_page=vs_page, v_row=vs_row,
            ),
        )  # fmt: skip

    @cute.jit
    def _ring_prologue(self, ring, pages, tile_begin, n_iters, seq, seq_len, mBT, tid, n_threads=THREADS):
        """Tiles 0 .. stages - 2 in flight; ``pages`` then holds the block-table entries of the next tile."""
        self._load_pages(pages, tile_begin, seq, seq_len, mBT)
        for st in cutlass.range_constexpr(self.stages - 1):
            if st < n_iters:
                self._load(ring, st, tile_begin + st, pages, tid, n_threads)
            cute.arch.cp_async_commit_group()
            if st + 1 < n_iters:
                self._load_pages(pages, tile_begin + st + 1, seq, seq_len, mBT)

    @cute.jit
    def _ring_next(self, ring, pages, it, tile_begin, n_iters, seq, seq_len, mBT, tid):
        """Tile ``it`` (the serial loop: e4m3, and fp6 at d = 256): wait until it landed, and refill the stage
        tile it - 1 used with tile it + stages - 1. Returns the shared-memory addresses of the K and V tiles
        the MMAs read: for fp6, K's packed ring stage (K in registers) and the e4m3 V tile, which the caller
        converts after the QK MMAs (``v_late``)."""
        stage = it % self.stages
        nxt = it + self.stages - 1
        cute.arch.cp_async_wait_group(self.stages - 2)
        # Tile `it` landed for every thread, and every warp is done with tile it - 1 (its ring
        # stage, P, the row maxima): refill that stage with tile it + stages - 1.
        self._sync()
        if nxt < n_iters:
            self._load(ring, nxt % self.stages, tile_begin + nxt, pages, tid)
        cute.arch.cp_async_commit_group()
        if nxt + 1 < n_iters:
            self._load_pages(pages, tile_begin + nxt + 1, seq, seq_len, mBT)  # latency hidden by tile it
        k_stage = ring.k_ring + stage * self.ring_tile_bytes
        v_stage = ring.v_ring + stage * self.ring_tile_bytes
        if cutlass.const_expr(self.config.packed):  # K goes to registers; the row-max barrier completes V
            v_stage = ring.v_conv
        return k_stage, v_stage

    def _packed_stage(self, ring, stage) -> SimpleNamespace:
        """Shared-memory addresses of ring stage ``stage`` for packed formats: the K and V rows (``k``, ``v``)
        and NVFP4's block-scale rows (``k_scales``, ``v_scales``: (keys, d / 16) bytes each)."""
        k_scales = ring.ks_ring + stage * 2 * self.scale_tile_bytes
        return SimpleNamespace(
            k=ring.k_ring + stage * self.ring_tile_bytes, v=ring.v_ring + stage * self.ring_tile_bytes,
            k_scales=k_scales, v_scales=k_scales + self.scale_tile_bytes,
        )  # fmt: skip

    def _mask_from(self, seq_len):
        """Keys below this are seen by every query row (no mask needed): key < seq_len, and with causal
        q_len > 1, key <= seq_len - q_len + qi for every qi >= 0."""
        if self.config.q_len > 1 and self.config.causal:
            return seq_len - (self.config.q_len - 1)
        return seq_len

    @cute.jit
    def _row_sum_tree(self, l_buf, s_sum, tid):
        """The per-key-slot row sums, stored in ``l_buf`` as (row, key) fp32, reduced in the Thor kernel's
        order into ``s_sum[tw, row]``: 64 threads add each 32-key slice by the butterfly (key xor 16, 8,
        4, 2, 1; IEEE addition is commutative, so the tree is the same)."""
        self._sync()
        if tid < 4 * Q_TILE:
            row = tid % Q_TILE
            tw = tid // Q_TILE  # Thor's warp: keys 32 tw .. 32 tw + 31
            v = cute.make_rmem_tensor((32,), cutlass.Float32)
            for k in cutlass.range_constexpr(32):
                v[k] = ld_shared_f32(l_buf + (row * TILE_KEYS + 32 * tw + k) * 4)
            for width in (16, 8, 4, 2, 1):  # xor 16 first
                for k in cutlass.range_constexpr(width):
                    v[k] = v[k] + v[k + width]
            s_sum[tw, row] = v[0]
        self._sync()

    @cute.jit
    def _load(self, ring, stage, tile, pages, tid, n_threads=THREADS):
        """cp.async tile ``tile`` of K and V (``ring``: see ``_ring``) into ring stage ``stage`` (threads
        ``tid`` 0 .. n_threads - 1 share the copies)."""
        if cutlass.const_expr(self.config.packed):
            self._load_packed(ring, stage, tile, pages, tid, n_threads)
        else:
            self._load_tile(ring, stage, tile, pages, tid)

    @cute.jit
    def _page_of(self, pages, slot_in_tile):
        """pages[slot_in_tile] for a runtime index, by selects (no local-memory indexing)."""
        page = pages[0]
        for p in cutlass.range_constexpr(1, self.pages_per_tile):
            if slot_in_tile == p:
                page = pages[p]
        return page

    @cute.jit
    def _load_packed(self, r, stage, tile, pages, tid, n_threads=THREADS):
        """cp.async one tile of packed rows (d * bits / 8 bytes per key, unswizzled) into ring stage
        ``stage``, and for NVFP4 the tile's block-scale rows (d / 16 bytes per key); pages marked -1 are
        zero-filled (code 0 and scale 0: value 0)."""
        i64 = cutlass.Int64
        ps = self.config.page_size
        row_bytes = self.config.packed_row_bytes
        cpk = row_bytes // CHUNK  # 16-byte chunks per packed key row
        k_dst = r.k_ring + stage * self.ring_tile_bytes
        v_dst = r.v_ring + stage * self.ring_tile_bytes
        # The host passes strides in elements (codes); the packed rows are addressed in bytes.
        bits = self.fmt.bits
        k_page_b, k_row_b = i64(r.k_page) * bits // 8, i64(r.k_row) * bits // 8
        v_page_b, v_row_b = i64(r.v_page) * bits // 8, i64(r.v_row) * bits // 8
        for i in cutlass.range_constexpr(TILE_KEYS * cpk // n_threads):
            idx = tid + i * n_threads
            key = idx // cpk
            chunk = idx % cpk
            page = self._page_of(pages, key // ps)
            nbytes = cutlass.Int32(CHUNK)
            if page < 0:
                nbytes = cutlass.Int32(0)
                page = cutlass.Int32(0)
            row = i64(key % ps)  # TILE_KEYS is a multiple of the page size
            k_src = r.k_base + i64(page) * k_page_b + row * k_row_b + r.head_k_off + i64(chunk * CHUNK)
            v_src = r.v_base + i64(page) * v_page_b + row * v_row_b + r.head_v_off + i64(chunk * CHUNK)
            cp_async_16(k_dst + idx * CHUNK, k_src, nbytes, policy=r.policy)
            cp_async_16(v_dst + idx * CHUNK, v_src, nbytes, policy=r.policy)
        if cutlass.const_expr(self.config.kv_format == "nvfp4"):
            for j in cutlass.range_constexpr(2 * TILE_KEYS // n_threads):
                # one key row of scales per thread and pass: K (rows 0-127), V (128-255)
                scale_row = tid + j * n_threads
                key = scale_row % TILE_KEYS
                page = self._page_of(pages, key // ps)
                nbytes = cutlass.Int32(8)
                if page < 0:
                    nbytes = cutlass.Int32(0)
                    page = cutlass.Int32(0)
                row = i64(key % ps)  # TILE_KEYS is a multiple of the page size
                groups = self.d // 16
                dst = r.ks_ring + stage * 2 * self.scale_tile_bytes + key * groups
                sc = r.sc
                src = sc.k_base + i64(page) * i64(sc.k_page) + row * i64(sc.k_row)
                if scale_row >= TILE_KEYS:
                    dst = dst + self.scale_tile_bytes
                    src = sc.v_base + i64(page) * i64(sc.v_page) + row * i64(sc.v_row)
                for h in cutlass.range_constexpr(groups // 8):
                    cp_async_8(dst + 8 * h, src + 8 * h, nbytes)

    @cute.jit
    def _load_group(self, packed, scales, idx):
        """The packed words of 16-element group ``idx`` of a tile (and its NVFP4 scale byte, else 0)."""
        bits = self.fmt.bits
        groups = self.d // CHUNK
        src = packed + (idx // groups) * self.config.packed_row_bytes + (idx % groups) * (CHUNK * bits // 8)
        if cutlass.const_expr(bits == 6):
            w = (ld_shared_b32(src), ld_shared_b32(src + 4), ld_shared_b32(src + 8))
        else:
            w = ld_shared_v2_b32(src)
        sb = cutlass.Int32(0)
        if cutlass.const_expr(self.config.kv_format == "nvfp4"):
            sb = ld_shared_u8(scales + idx)  # the scale byte of (key, group) is byte idx of the scale rows
        return w, sb

    @cute.jit
    def _convert_tiles(self, k_packed, v_packed, k_conv, v_conv, k_scales, v_scales, tid, n_threads=THREADS):
        """Packed codes of one K and one V tile -> e4m3 bytes in the swizzled layout the MMAs read: thread
        t converts the 16-element groups t + n_threads i (key = group // (d / 16)) of each tile exactly (ptx.py):
        fp6 / fp4 codes become e4m3 bytes of value * 2^-k, each code's bits placed (``scaled_kv``; the Q
        fragments and P carry 2^k); NVFP4 becomes e4m3(code * fp32(scale) * 2^-3) with the block scales of
        this ring stage (``*_scales``: (keys, d / 16) bytes), looked up in a table made once per group;
        scaled e2m1's V tile holds each 8 head dims as the even ones, then the odd ones (``v_even_odd``).
        Every packed word (and scale byte) of both tiles is loaded before the first conversion, so the
        loads' latency overlaps (1.03-1.14x faster at d = 256 on the H200 than loading each group as it
        is converted)."""
        cfg = self.config
        fmt = cfg.kv_format
        bits = self.fmt.bits
        groups = self.d // CHUNK  # 16-element groups per key = output chunks per key
        per_tile = TILE_KEYS * groups // n_threads
        words = []
        scale_bytes = []
        tiles = ((k_packed, k_scales), (v_packed, v_scales))
        convs = (k_conv, v_conv)
        is_v = (False, True)
        if cutlass.const_expr(k_conv is None):  # K goes to registers (``_k_words``): V only
            tiles, convs, is_v = tiles[1:], convs[1:], is_v[1:]
        if cutlass.const_expr(
            v_conv is None
        ):  # K only (the converter warps at d = 256: K, then V, half the words live)
            tiles, convs, is_v = tiles[:1], convs[:1], is_v[:1]
        for t in cutlass.range_constexpr(len(tiles)):  # both tiles' words, all before the first conversion
            for i in cutlass.range_constexpr(per_tile):
                w, sb = self._load_group(tiles[t][0], tiles[t][1], tid + i * n_threads)
                words.append(w)
                scale_bytes.append(sb)
        for t, conv in enumerate(convs):
            ordered = not (self.v_even_odd and is_v[t])  # V (v_even_odd): even / odd head dims of each 8
            for i in cutlass.range_constexpr(per_tile):
                idx = tid + i * n_threads
                key = idx // groups
                grp = idx % groups
                w = words[t * per_tile + i]
                if cutlass.const_expr(bits == 6):
                    o0, o1, o2, o3 = fp6x16_to_e4m3x16_scaled(w[0], w[1], w[2], e3m2=fmt == "e3m2")
                elif cutlass.const_expr(fmt == "nvfp4"):
                    table = nvfp4_block_table(scale_bytes[t * per_tile + i])
                    o0, o1 = e2m1x8_to_e4m3x8(w[0], table)
                    o2, o3 = e2m1x8_to_e4m3x8(w[1], table)
                else:
                    o0, o1 = e2m1x8_to_e4m3x8_scaled(w[0], ordered=ordered)
                    o2, o3 = e2m1x8_to_e4m3x8_scaled(w[1], ordered=ordered)
                st_shared_v4_b32(conv + key * self.d + ((grp ^ (key & 7)) * CHUNK), o0, o1, o2, o3)

    @cute.jit
    def _k_words(self, k_packed, key, c):
        """K in registers (e2m1, fp6 at d = 256): the e4m3 bytes of lane c's head dims of ``key``, one word
        per k-step of S (``_q_in_k_order`` gives Q's bytes in the same order), converted from the packed ring
        stage as ``_convert_tiles`` does. fp6 keeps the code order (word s: dims base + 4s .. + 3); e2m1 skips
        the interleave (words 2u, 2u + 1: the even / odd codes of dims base + 8u .. + 7)."""
        cfg = self.config
        row = k_packed + key * cfg.packed_row_bytes + c * self.k_span
        packed = []
        for h in cutlass.range_constexpr(self.k_span // 16):  # 16 (e2m1 d = 128), 32 (e2m1 d = 256), 48 (fp6) bytes
            packed += list(ld_shared_v4_b32(row + 16 * h))
        words = []
        if cutlass.const_expr(self.fmt.bits == 6):
            for v in cutlass.range_constexpr(len(packed) // 3):
                w = packed[3 * v : 3 * v + 3]
                words += list(fp6x16_to_e4m3x16_scaled(w[0], w[1], w[2], e3m2=cfg.kv_format == "e3m2"))
        else:
            for u in cutlass.range_constexpr(len(packed)):
                words += list(e2m1x8_to_e4m3x8_scaled(packed[u], ordered=False))
        return words

    @cute.jit
    def _q_in_k_order(self, q_row, s, c):
        """Q's four e4m3 bytes (at global address ``q_row``, a query row) for k-step ``s`` of lane c,
        in the head-dim order of ``_k_words``."""
        base = q_row + c * (self.d // 4)  # lane c's first head dim (one byte per dim)
        word = cutlass.Int32(0)
        if cutlass.const_expr(self.config.scaled_kv and self.fmt.bits == 4):  # even / odd dims of 8
            x0, x1 = ld_global_v2_b32(base + 8 * (s // 2))
            word = prmt(x0, x1, 0x7531 if s % 2 else 0x6420)
        else:
            word = ld_global_b32(base + 4 * s)
        return word

    @cute.jit
    def _load_pages(self, pages, tile, seq, seq_len, mBT):
        """Block-table entries of the pages of ``tile`` (128 / PS of them); -1 for pages at or past the
        sequence end (their rows are zero-filled, and the block table is not read there)."""
        ps = self.config.page_size
        for p in cutlass.range_constexpr(self.pages_per_tile):
            slot = tile * self.pages_per_tile + p
            page = cutlass.Int32(-1)
            if slot * ps < seq_len:
                page = mBT[seq, slot]
            pages[p] = page

    @cute.jit
    def _load_tile(self, r, stage, tile, pages, tid):
        """cp.async one 128-key tile of K and V into ring stage ``stage``: thread t copies 16-byte chunk
        t % chunks of keys t // chunks + i * (256 / chunks). A chunk lands at (key, chunk ^ (key & 7))
        (the XOR swizzle that puts ldmatrix's eight rows on distinct banks). Pages marked -1 (at or past
        the sequence end) are zero-filled without reading the pool."""
        i64 = cutlass.Int64
        ps = self.config.page_size
        chunks = self.chunks
        keys_per_pass = THREADS // chunks  # 16 (d = 256) or 32 (d = 128) keys per pass
        chunk = tid % chunks
        k_dst = r.k_ring + stage * self.ring_tile_bytes
        v_dst = r.v_ring + stage * self.ring_tile_bytes
        for i in cutlass.range_constexpr(TILE_KEYS // keys_per_pass):
            key = tid // chunks + i * keys_per_pass
            if cutlass.const_expr(keys_per_pass <= ps):  # the pass lies inside one page
                page = pages[(i * keys_per_pass) // ps]
            else:
                page = self._page_of(pages, key // ps)
            nbytes = cutlass.Int32(CHUNK)
            if page < 0:
                nbytes = cutlass.Int32(0)
                page = cutlass.Int32(0)
            row = i64(key % ps)  # TILE_KEYS is a multiple of the page size: the row does not depend on the tile
            k_src = r.k_base + i64(page) * i64(r.k_page) + row * i64(r.k_row) + r.head_k_off + i64(chunk * CHUNK)
            v_src = r.v_base + i64(page) * i64(r.v_page) + row * i64(r.v_row) + r.head_v_off + i64(chunk * CHUNK)
            off = key * self.d + ((chunk ^ (key & 7)) * CHUNK)
            cp_async_16(k_dst + off, k_src, nbytes, policy=r.policy)
            cp_async_16(v_dst + off, v_src, nbytes, policy=r.policy)

    @cute.jit
    def _epilogue(self, row_sum, m_prev, o_acc, s_sum, l_buf, mO, mLSE, mOp, mMp, mLp, mNSplits, seq, slot, hb, head,
                  b, h_k, n_q, n_base, o_seq, lse_scale, v_descale, scale_o, warp, g, c):  # fmt: skip
        """Row sums in the Thor kernel's order, then O and LSE (unsplit) or the fp32 partials (split).

        Thor keeps one running sum per key slot of the tile (its TMEM lane), adds the 32 slots of each
        warp by a butterfly (key xor 16, 8, 4, 2, 1) and the four warp sums left to right. Here the slots
        of 16 keys live in each of eight warps, so they go through shared memory (``l_buf``, aliasing
        the K ring) and 64 threads redo the same tree exactly (IEEE addition is commutative)."""
        i64 = cutlass.Int64
        lane = cute.arch.lane_idx()
        self._sync()  # every warp is past the last tile: the K ring is free
        for j in cutlass.range_constexpr(NB_S):
            for e in cutlass.range_constexpr(2 * self.halves):
                row = g + 8 * (e >> 1)
                key = warp * KEYS_PER_WARP + 8 * j + 2 * c + (e & 1)
                st_shared_f32(l_buf + (row * TILE_KEYS + key) * 4, row_sum[j * 4 + e])
        self._row_sum_tree(l_buf, s_sum, warp * 32 + lane)

        out_scale, part_scale, n_splits = self._epilogue_scales(scale_o, v_descale, mNSplits, seq)
        o_base = mO.iterator.toint()
        op_base = mOp.iterator.toint()
        for half in cutlass.range_constexpr(self.halves):
            row = g + 8 * half
            n = n_base + row
            if n < n_q:
                norm, row_off = self._finish_row(
                    row, n, m_prev[half], s_sum, warp == 0 and c == 0, lse_scale, out_scale, n_splits, mLSE, mMp,
                    mLp, hb, slot, seq, head, n_q, o_seq,
                )  # fmt: skip
                for ch in cutlass.range_constexpr(self.pv_chunks):
                    even = (2 * ch) * 4 + 2 * half
                    odd = (2 * ch + 1) * 4 + 2 * half
                    # d = 16 chunk + 4c + (0: even c0, 1: odd c0, 2: even c1, 3: odd c1)
                    vals = (o_acc[even], o_acc[odd], o_acc[even + 1], o_acc[odd + 1])
                    dd = (warp * self.pv_chunks + ch) * CHUNK + 4 * c
                    if n_splits == 1:
                        o_lo = f32x2_to_bf16_pair(vals[0] * norm, vals[1] * norm)
                        o_hi = f32x2_to_bf16_pair(vals[2] * norm, vals[3] * norm)
                        st_global_v2_b32(o_base + (row_off + i64(dd)) * 2, o_lo, o_hi)
                    else:
                        p_off = self._partial_offset(slot, seq, head, n, b, h_k, n_q)
                        st_global_v4_f32(
                            op_base + (p_off + i64(dd)) * 4,
                            vals[0] * part_scale, vals[1] * part_scale, vals[2] * part_scale, vals[3] * part_scale,
                        )  # fmt: skip

    def _epilogue_scales(self, scale_o, v_descale, mNSplits, seq):
        """(factor of unsplit O, factor of the fp32 partials, splits of this sequence): both undo P's scale
        (P = e4m3(p * 448) on the e4m3-Q path) and apply the V descale; the unsplit one also scale_o."""
        f32 = cutlass.Float32
        inv_p_scale = f32(1.0 / self.config.p_scale)
        n_splits = 1
        if cutlass.const_expr(self.config.max_splits > 1):
            n_splits = mNSplits[seq]
        return scale_o * v_descale * inv_p_scale, v_descale * inv_p_scale, n_splits

    @cute.jit
    def _finish_row(self, row, n, m_row, s_sum, writes_stats, lse_scale, out_scale, n_splits, mLSE, mMp, mLp, hb,
                    slot, seq, head, n_q, o_seq):  # fmt: skip
        """Query row ``n`` (tile row ``row``, running max ``m_row`` in raw S units): its row sum (the four
        warp-group sums of ``_row_sum_tree``, left to right), LSE (unsplit) or the split's m and l, written
        by the thread with ``writes_stats``. Returns (the factor for this row's O accumulators when
        unsplit, the row's element offset in O)."""
        f32, i64 = cutlass.Float32, cutlass.Int64
        l_total = s_sum[0, row] + s_sum[1, row] + s_sum[2, row] + s_sum[3, row]
        m_out = mul_rn(m_row, lse_scale)  # rounded before the add (never an fma), as the spec
        if writes_stats:
            if n_splits == 1:
                mLSE[n, hb] = m_out + cute.math.log(l_total, fastmath=False)
            else:
                mMp[n, hb, slot] = m_out
                mLp[n, hb, slot] = l_total
        # + 1e-30: an empty row has l = 0 and O = 0 and writes 0; otherwise l >= 1 absorbs it.
        norm = out_scale / (l_total + f32(1e-30))
        return norm, i64(seq) * i64(o_seq) + (i64(head) * i64(n_q) + i64(n)) * i64(self.d)

    def _partial_offset(self, slot, seq, head, n, b, h_k, n_q):
        """Element offset of query row ``n``'s d values in the (splits, b, h_k, n_q, d) fp32 partials."""
        i64 = cutlass.Int64
        return (((i64(slot) * i64(b) + i64(seq)) * i64(h_k) + i64(head)) * i64(n_q) + i64(n)) * i64(self.d)
