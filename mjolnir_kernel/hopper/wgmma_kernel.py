"""EXPERIMENTAL: the Hopper decode kernel's fp8 path on warpgroup MMAs (``HopperConfig(mma="wgmma")``,
e4m3 Q). Not bit-faithful to the spec, and not faster; kept as a research backend and as the record of
the experiment (measured on the H200; README "Hopper's fp8 tensor cores, and the experimental wgmma path"):

  * Hopper's fp8 tensor cores do not return the exact dot product rounded once: over contraction
    lengths 32 .. 256 their error reaches ~2^-10 of sum |a_i b_i| (``benchmarks/probe_fp8_accumulation``),
    so S moves by up to a few 1e-3 and P codes flip. Against the spec, 1 of 33 conformance cases passes
    (54-98 % of bf16 outputs bit-identical, LSE off by up to 7e-3); the GPU test holds it to the bound
    that error implies instead (``mjolnir_kernel.conformance.FP8_MMA_REL_ERROR``).
  * Its tile loop has fewer instructions than mma.sync's (317 vs 362 at d = 128, e4m3), yet it ran within
    1-2 % of it for e4m3 KV (either way) and 4-11 % slower for the sub-byte formats (each tile waits for
    its two wgmma groups).

Same CTA, work list, cp.async ring, sub-byte conversion, masks, softmax order and epilogue as
``decode_kernel.py``; what changes is who multiplies. Hopper's wgmma multiplies e4m3 by e4m3 natively
but wants 64 rows on M, and decode has 4-16 query rows, so the keys go on M (swap AB):

  S^T (keys x rows) = K (keys x d) . Q^T        warpgroup w: keys 64 w .. 64 w + 63, k-steps over d
  O^T (d x rows)    = V^T (d x keys) . P^T      warpgroup w: d in [w d/2, (w+1) d/2), k-steps over keys

N = 16 query rows (the CTA's query tile). K and V are A operands from registers: K by ``ldmatrix``
(its fragment is exactly wgmma's 8-bit A layout), V^T by ``ldmatrix.trans`` and two byte permutes per
register (a transpose in registers: fp8 wgmma reads shared-memory operands only K-major, and V is
stored d-contiguous). Q and P are B operands in shared memory, K-major, no swizzle. No KV value is
widened: e4m3 bytes go straight into the tensor cores, which on the e4m3-Q path multiply exactly the
values the spec multiplies.

Orderings that are relabelings (the spec sums are order-free; masks and softmax see true indices):
  * V^T's M rows: warp row g holds d = 16 chunk + 2g, row g + 8 holds d = 16 chunk + 2g + 1;
  * P^T's K positions inside a 32-key step: slot 4c + {0, 1, 2, 3} holds key 2c, 8 + 2c, 2c + 1, 9 + 2c
    (and + 16 for the second half), which is the order ``ldmatrix.trans`` + ``prmt`` gives V; S's keys
    g and g + 8 of a warp land on adjacent slots, so P goes to shared memory as one 16-bit store per row.

Each tile's P.V goes into fresh accumulators and is added to the fp32 O registers (no tensor-core
accumulation longer than one tile: NUMERICS.md section 4).

``HopperConfig.v_operand`` picks how V^T reaches the P.V wgmma (README "V^T for the fp8 wgmma"):
"registers" (the above), "smem" (the same fragments stored into a K-major e4m3 V^T tile, both operands
from shared memory: the same bits, 0.89x at d = 128 and 0.99-1.01x at d = 256 on the H200) or "f16"
(V widened exactly to f16 into an M-major operand, P stored as f16, an f16 wgmma: 0.69-0.77x, and O a
little closer to the spec since only S stays on the fp8 MMA).
"""

import cutlass
import cutlass.cute as cute
import cutlass.memory

from .config import Q_TILE, THREADS, TILE_KEYS, WARPS
from .decode_kernel import CHUNK, HopperDecodeKernel, _fmax
from .ptx import (
    GMMA_CORE_BYTES,
    e4m3x4_to_pairs,
    f32x2_to_bf16_pair,
    f32x2_to_e4m3_pair,
    f32x2_to_e4m3x2,
    fence_proxy_async_shared,
    gmma_desc_bits,
    ld_global_b32,
    ld_shared_v4_b32,
    ldmatrix_x4,
    prmt,
    st_global_b32,
    st_global_v2_f32,
    st_shared_b16,
    st_shared_b32,
    st_shared_f32,
    st_shared_v4_b32,
    wgmma_e4m3_rs,
    wgmma_ss,
)

WG_KEYS = TILE_KEYS // 2  # keys per warpgroup in S (M = 64)
WARP_ROWS = 16  # M rows per warp inside a warpgroup
K_STEP = 32  # k of one fp8 wgmma
P_GROUP_BYTES = 8 * TILE_KEYS  # one 8-row group of P^T (K-major, no swizzle): 8 core matrices along K
SEL_EVEN = 0x6240  # prmt: bytes 0, 2 of r0 and r1 -> (r0.b0, r1.b0, r0.b2, r1.b2)
SEL_ODD = 0x7351  # (r0.b1, r1.b1, r0.b3, r1.b3)
# v_operand="f16": V^T (M-major) and P^T (K-major) as f16, 8-row groups of 16 core matrices (8 keys each)
F16_GROUP_BYTES = 2 * 8 * TILE_KEYS
BYTES_EVEN = 0x6420  # prmt(w0, w1): bytes 0, 2, 4, 6 of the pair -> one word (head dims 0, 2, 4, 6 of 8)
BYTES_ODD = 0x7531  # bytes 1, 3, 5, 7


def m_row_dim(m: int) -> int:
    """Head dim (inside a warpgroup's half) of V^T's M row ``m``: the relabeling ``ldmatrix.trans`` gives
    (rows g and g + 8 of a warp's 16 hold 2g and 2g + 1), which the epilogue's stores assume."""
    return 16 * (m // 16) + 2 * (m % 8) + (m % 16) // 8


def f16_slot(key: int) -> int:
    """v_operand="f16": position of a key (0 .. 127 of the tile) along P^T's and V^T's K axis: keys j and
    j + 8 of each 16 sit side by side, so a thread's two S rows (keys g, g + 8) store as one f16x2."""
    j = key % 16
    return 16 * (key // 16) + 2 * (j % 8) + j // 8


def f16_m_major_offset(m: int, k: int) -> int:
    """Byte offset of (m, k) in an M-major, no-swizzle 16-bit wgmma operand: 8 M values contiguous, 8 k
    rows of 16 bytes per core matrix, core matrices 128 bytes apart along K and F16_GROUP_BYTES along M
    (PTX: ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) with LBO 128, SBO F16_GROUP_BYTES)."""
    return (m % 8) * 2 + (m // 8) * F16_GROUP_BYTES + (k % 8) * 16 + (k // 8) * GMMA_CORE_BYTES


def f16_k_major_offset(row: int, k: int) -> int:
    """Byte offset of (row, k) in a K-major, no-swizzle 16-bit wgmma operand (P^T for v_operand="f16")."""
    return (row % 8) * 16 + (row // 8) * F16_GROUP_BYTES + (k % 8) * 2 + (k // 8) * GMMA_CORE_BYTES


def p_slot(key_in_step: int) -> int:
    """Position of a key (0 .. 31 inside a 32-key k-step) along P^T's K axis (see the module docstring)."""
    half, k = divmod(key_in_step, 16)
    lo = k % 8
    return 16 * half + 4 * (lo // 2) + 2 * (lo % 2) + k // 8


def b_operand_offset(row: int, k: int, group_bytes: int) -> int:
    """Byte offset of (row, k) in a K-major, no-swizzle wgmma B operand with ``group_bytes`` between
    8-row groups and 16-byte core-matrix columns 128 bytes apart."""
    return (k // 16) * GMMA_CORE_BYTES + (row // 8) * group_bytes + (row % 8) * 16 + k % 16


class HopperWgmmaDecodeKernel(HopperDecodeKernel):
    """``HopperDecodeKernel`` with S and P.V on fp8 wgmma (keys on M); e4m3 Q only."""

    def __init__(self, config):
        super().__init__(config)
        if config.mma != "wgmma" or not config.fp8:
            raise ValueError(f"HopperWgmmaDecodeKernel: needs mma='wgmma' and e4m3 Q, got {config.short_name()}")
        d = self.d
        self.q_group_bytes = 8 * d  # 8-row groups of Q (K-major: d / 16 core matrices each)
        self.s_steps = d // K_STEP
        self.pv_steps = TILE_KEYS // K_STEP
        self.m_blocks = (d // 2) // 64  # 64-row M blocks of O^T per warpgroup

    # ------------------------------------------------------------------------------------------
    @cute.kernel
    def kernel(
        self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mKS: cute.Tensor, mVS: cute.Tensor,
        mBT: cute.Tensor, mSeqLens: cute.Tensor, mWork: cute.Tensor, mNSplits: cute.Tensor, mQD: cute.Tensor,
        mKD: cute.Tensor, mVD: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor, mOp: cute.Tensor,
        mMp: cute.Tensor, mLp: cute.Tensor, b: cutlass.Int32, h_k: cutlass.Int32, n_q: cutlass.Int32,
        q_seq: cutlass.Int32, o_seq: cutlass.Int32, k_page: cutlass.Int32, k_row: cutlass.Int32,
        k_head: cutlass.Int32, v_page: cutlass.Int32, v_row: cutlass.Int32, v_head: cutlass.Int32,
        ks_page: cutlass.Int32, ks_row: cutlass.Int32, ks_head: cutlass.Int32, vs_page: cutlass.Int32,
        vs_row: cutlass.Int32, vs_head: cutlass.Int32, scale_qs: cutlass.Float32,
        scale_qs_log2_e: cutlass.Float32, scale_o: cutlass.Float32, num_pages: cutlass.Int32, atom_k, tma_k,
        atom_v, tma_v, mCnt: cute.Tensor,
    ):  # fmt: skip
        cfg = self.config
        f32, i32, i64 = cutlass.Float32, cutlass.Int32, cutlass.Int64
        d = self.d

        if cutlass.const_expr(cfg.pdl):
            cute.arch.griddepcontrol_wait()
            cute.arch.griddepcontrol_launch_dependents()

        work_idx, q_tile_idx, head = cute.arch.block_idx()
        tid, _, _ = cute.arch.thread_idx()
        warp = cute.arch.make_warp_uniform(tid // 32)
        wg = warp // 4
        wq = warp % 4
        lane = tid % 32
        g = lane // 4
        c = lane % 4

        seq = mWork[work_idx, 0]
        tile_begin = mWork[work_idx, 1]
        tile_end = mWork[work_idx, 2]
        slot = mWork[work_idx, 3]
        n_iters = tile_end - tile_begin
        if n_iters > 0:
            seq_len = mSeqLens[seq]
            hb = head + h_k * seq
            n_base = q_tile_idx * Q_TILE
            h_r = n_q // cfg.q_len

            smem = cutlass.memory.SmemAllocator()
            ring = self._ring(smem, mK, mV, mKS, mVS, head, k_page, k_row, k_head, v_page, v_row, v_head, ks_page,
                              ks_row, ks_head, vs_page, vs_row, vs_head)  # fmt: skip
            q_buf = smem.allocate_array(cutlass.Uint8, Q_TILE * d, byte_alignment=128).toint()
            vo = cfg.v_operand
            p_bytes = Q_TILE * TILE_KEYS * (2 if vo == "f16" else 1)
            p_buf = smem.allocate_array(cutlass.Uint8, p_bytes, byte_alignment=128).toint()
            vt_buf = p_buf
            if cutlass.const_expr(vo != "registers"):  # V^T of the current tile, per warpgroup: d / 2 rows
                vt_buf = smem.allocate_array(cutlass.Uint8, cfg.v_operand_bytes, byte_alignment=128).toint()
            s_max = smem.allocate_tensor(f32, cute.make_layout((WARPS, Q_TILE), stride=(1, WARPS)), 16)
            s_sum = smem.allocate_tensor(f32, cute.make_layout((WARPS, Q_TILE), stride=(Q_TILE, 1)), 16)
            s_max_addr = s_max.iterator.toint()

            # -- Q (once): e4m3 rows n_base .. n_base + 15 into the B-operand layout; absent rows are 0
            q_row0 = i64(seq) * i64(q_seq) + (i64(head) * i64(n_q) + i64(n_base)) * i64(d)
            q_base = mQ.iterator.toint()
            words = d // 4
            for i in cutlass.range_constexpr(Q_TILE * words // THREADS):
                idx = tid + i * THREADS
                row = idx // words
                kb = (idx % words) * 4
                w = i32(0)
                if n_base + row < n_q:
                    w = ld_global_b32(q_base + q_row0 + i64(row * d + kb))
                st_shared_b32(q_buf + b_operand_offset(row, kb, self.q_group_bytes), w)
            fence_proxy_async_shared()  # the first tile's barrier publishes Q to the warpgroups
            q_desc = i64((q_buf >> 4) & 0x3FFF) | i64(gmma_desc_bits(GMMA_CORE_BYTES, self.q_group_bytes))
            group_bytes = F16_GROUP_BYTES if vo == "f16" else P_GROUP_BYTES  # P^T's (and V^T's) 8-row groups
            p_desc = i64((p_buf >> 4) & 0x3FFF) | i64(gmma_desc_bits(GMMA_CORE_BYTES, group_bytes))
            # V^T in shared memory: K-major e4m3 (as P^T) or M-major f16 (LBO: along K, SBO: along M)
            vt_desc = i64((vt_buf >> 4) & 0x3FFF) | i64(gmma_desc_bits(GMMA_CORE_BYTES, group_bytes))
            step_desc = 2 * GMMA_CORE_BYTES >> 4  # one k-step = two core matrices along K
            wg_groups = d // 16  # 8-row groups of V^T per warpgroup (d / 2 rows)

            qk_descale = mQD[hb] * mKD[hb]
            exp_scale = scale_qs_log2_e * qk_descale
            lse_scale = scale_qs * qk_descale
            v_descale = mVD[hb]

            # -- running state; element e of an accumulator: M row g + 8 ((e >> 1) & 1),
            #    query row 2c + (e & 1) + 8 (e >> 2); rr(e) = (e & 1) + 2 (e >> 2) indexes this thread's rows
            m_prev = cute.make_rmem_tensor((4,), f32)
            m_prev.fill(-f32.inf)
            row_sum = cute.make_rmem_tensor((8,), f32)
            row_sum.fill(f32(0))
            o_acc = cute.make_rmem_tensor((8 * self.m_blocks,), f32)
            o_acc.fill(f32(0))

            pages = cute.make_rmem_tensor((self.pages_per_tile,), i32)
            self._ring_prologue(ring, pages, tile_begin, n_iters, seq, seq_len, mBT, tid)

            p_scale = f32(cfg.p_scale)
            mask_from = self._mask_from(seq_len)
            key_warp = wg * WG_KEYS + wq * WARP_ROWS  # this warp's 16 keys in the tile (S's M rows)
            for it in cutlass.range(n_iters, unroll=1):
                # (per-group conversion loads: batching them spills here)
                k_stage, v_stage = self._ring_next(
                    ring, pages, it, tile_begin, n_iters, seq, seq_len, mBT, tid, batch_loads=False
                )

                # 1. S^T for this warpgroup's 64 keys: K fragments by ldmatrix (no conversion)
                key_ld = key_warp + (lane % 8) + 8 * ((lane // 8) % 2)
                ka = []
                descs = []
                for s in cutlass.range_constexpr(self.s_steps):
                    chunk = 2 * s + lane // 16
                    kr = ldmatrix_x4(k_stage + key_ld * d + ((chunk ^ (key_ld & 7)) * CHUNK))
                    ka.extend(kr)
                    descs.append(q_desc + i64(s * step_desc))
                sv = wgmma_e4m3_rs(ka, descs, n=Q_TILE)
                sacc = cute.make_rmem_tensor((8,), f32)
                for e in cutlass.range_constexpr(8):
                    sacc[e] = sv[e]
                # V^T of this warpgroup's d half into shared memory (published by the barrier below)
                if cutlass.const_expr(vo == "smem"):
                    self._store_v_transposed(v_stage, vt_buf + wg * (wg_groups * P_GROUP_BYTES), wg, wq, lane)
                    fence_proxy_async_shared()
                elif cutlass.const_expr(vo == "f16"):
                    self._widen_v(v_stage, vt_buf, wg, tid % 128)
                    fence_proxy_async_shared()

                # 2. mask; row max over this warp's keys (in-thread pair, then lanes xor 4, 8, 16)
                if (tile_begin + it + 1) * TILE_KEYS > mask_from:
                    key0 = (tile_begin + it) * TILE_KEYS + key_warp + g
                    for e in cutlass.range_constexpr(8):
                        key = key0 + 8 * ((e >> 1) & 1)
                        masked = key >= seq_len
                        if cutlass.const_expr(cfg.q_len > 1 and cfg.causal):
                            qi = (n_base + 2 * c + (e & 1) + 8 * (e >> 2)) // h_r
                            masked = masked or key > seq_len - cfg.q_len + qi
                        if masked:
                            sacc[e] = -f32.inf
                mx = cute.make_rmem_tensor((4,), f32)
                for r in cutlass.range_constexpr(4):
                    e = (r & 1) + 4 * (r >> 1)
                    x = _fmax(sacc[e], sacc[e + 2])
                    for off in (4, 8, 16):
                        x = _fmax(x, cute.arch.shuffle_sync_bfly(x, offset=off, mask=0xFFFFFFFF))
                    mx[r] = x
                if g == 0:
                    for r in cutlass.range_constexpr(4):
                        s_max[warp, 2 * c + (r & 1) + 8 * (r >> 1)] = mx[r]
                cute.arch.sync_threads()

                # 3. running max, p, corr, row sums per key slot, P (e4m3(p * 448)) to shared memory
                m_use = cute.make_rmem_tensor((4,), f32)
                corr = cute.make_rmem_tensor((4,), f32)
                for r in cutlass.range_constexpr(4):
                    row = 2 * c + (r & 1) + 8 * (r >> 1)
                    m_use[r], corr[r] = self._running_max(m_prev, r, s_max_addr, row, exp_scale)
                for e in cutlass.range_constexpr(8):
                    rr = (e & 1) + 2 * (e >> 2)
                    p = cute.math.exp2((sacc[e] - m_use[rr]) * exp_scale, fastmath=True)
                    sacc[e] = p
                    row_sum[e] = cute.math.fma(corr[rr], row_sum[e], p)
                # keys g and g + 8 of this warp sit on adjacent P^T slots: one 16-bit store per row
                if cutlass.const_expr(vo == "f16"):  # P = e4m3(p * 448) as f16; keys g, g + 8 at f16_slot
                    ks = key_warp + 2 * g
                    p_at = p_buf + (ks % 8) * 2 + (ks // 8) * GMMA_CORE_BYTES
                    for r in cutlass.range_constexpr(4):
                        e = (r & 1) + 4 * (r >> 1)
                        row = 2 * c + (r & 1) + 8 * (r >> 1)
                        pp = f32x2_to_e4m3_pair(sacc[e] * p_scale, sacc[e + 2] * p_scale)
                        st_shared_b32(p_at + (row % 8) * 16 + (r >> 1) * F16_GROUP_BYTES, pp)
                else:
                    step = key_warp // K_STEP
                    slot0 = step * K_STEP + 16 * (wq % 2) + 4 * (g // 2) + 2 * (g % 2)
                    for r in cutlass.range_constexpr(4):
                        e = (r & 1) + 4 * (r >> 1)
                        row = 2 * c + (r & 1) + 8 * (r >> 1)
                        pp = f32x2_to_e4m3x2(sacc[e] * p_scale, sacc[e + 2] * p_scale)
                        st_shared_b16(p_buf + b_operand_offset(row, slot0, P_GROUP_BYTES), pp)
                fence_proxy_async_shared()
                if cute.arch.vote_any_sync(corr[0] != f32(1.0) or corr[1] != f32(1.0) or corr[2] != f32(1.0)
                                           or corr[3] != f32(1.0)):  # fmt: skip
                    for i in cutlass.range_constexpr(cute.size(o_acc)):
                        e = i % 8
                        o_acc[i] = o_acc[i] * corr[(e & 1) + 2 * (e >> 2)]
                cute.arch.sync_threads()

                # 4. O^T += V^T.P^T on this warpgroup's d half: V^T fragments by ldmatrix.trans + prmt, or
                #    V^T from shared memory (v_operand "smem" / "f16")
                if cutlass.const_expr(vo != "registers"):
                    kind = "f16" if vo == "f16" else "e4m3"
                    n_steps = TILE_KEYS // (16 if vo == "f16" else K_STEP)
                    for mb in cutlass.range_constexpr(self.m_blocks):
                        a0 = vt_desc + i64((wg * wg_groups + 8 * mb) * (group_bytes >> 4))
                        adescs = [a0 + i64(s * step_desc) for s in range(n_steps)]
                        bdescs = [p_desc + i64(s * step_desc) for s in range(n_steps)]
                        pv = wgmma_ss(adescs, bdescs, n=Q_TILE, dtype=kind)
                        for e in cutlass.range_constexpr(8):
                            o_acc[8 * mb + e] = o_acc[8 * mb + e] + pv[e]
                for mb in cutlass.range_constexpr(self.m_blocks if vo == "registers" else 0):
                    dch = wg * (d // 2 // CHUNK) + mb * (64 // CHUNK) + wq  # this warp's 16-wide d chunk
                    va = []
                    pdescs = []
                    for s in cutlass.range_constexpr(self.pv_steps):
                        va.extend(self._v_fragments(v_stage, dch, s, lane))
                        pdescs.append(p_desc + i64(s * step_desc))
                    pv = wgmma_e4m3_rs(va, pdescs, n=Q_TILE)
                    for e in cutlass.range_constexpr(8):
                        o_acc[8 * mb + e] = o_acc[8 * mb + e] + pv[e]

            cute.arch.cp_async_wait_group(0)
            self._wg_epilogue(
                row_sum, m_prev, o_acc, s_sum, ring.k_ring, mO, mLSE, mOp, mMp, mLp, mNSplits, seq, slot, hb, head, b,
                h_k, n_q, n_base, o_seq, lse_scale, v_descale, scale_o, warp, wg, wq, g, c, key_warp,
            )  # fmt: skip
            if cutlass.const_expr(self.fused_merge):
                self._merge_if_last(
                    ring.k_ring, mO, mLSE, mOp, mMp, mLp, mNSplits, mCnt, seq, head, hb, b, h_k, n_q, n_base, o_seq,
                    scale_o,
                )  # fmt: skip

    # ------------------------------------------------------------------------------------------
    def _v_fragments(self, v_stage, dch, s, lane):
        """The four A registers of V^T for k-step ``s`` (32 keys) and 16-wide d chunk ``dch``: one
        ``ldmatrix.trans`` (matrices: keys +0-7, +8-15, +16-23, +24-31), then byte permutes: M row g (d 2g)
        and g + 8 (d 2g + 1) of keys 0-15 of the step, then of keys 16-31. Trace-time only."""
        key = s * K_STEP + lane
        vr = ldmatrix_x4(v_stage + key * self.d + ((dch ^ (key & 7)) * CHUNK), trans=True)
        return (prmt(vr[0], vr[1], SEL_EVEN), prmt(vr[0], vr[1], SEL_ODD),
                prmt(vr[2], vr[3], SEL_EVEN), prmt(vr[2], vr[3], SEL_ODD))  # fmt: skip

    @cute.jit
    def _store_v_transposed(self, v_stage, vt_wg, wg, wq, lane):
        """v_operand="smem": this warp's V^T fragments (``ldmatrix.trans`` + ``prmt``, as the register
        path makes them) stored into the warpgroup's K-major e4m3 V^T tile ``vt_wg`` (the layout of P^T:
        8-row groups of P_GROUP_BYTES), M row 16 wq + g (+ 8) at k = p_slot order."""
        d = self.d
        g = lane // 4
        c = lane % 4
        base = vt_wg + g * 16 + 4 * c + (2 * wq) * P_GROUP_BYTES
        for mb in cutlass.range_constexpr(self.m_blocks):
            dch = wg * (d // 2 // CHUNK) + mb * (64 // CHUNK) + wq
            for s in cutlass.range_constexpr(self.pv_steps):
                regs = self._v_fragments(v_stage, dch, s, lane)
                for i in cutlass.range_constexpr(4):  # M row g + 8 (i % 2), k 32 s + 16 (i // 2) + 4c
                    off = (8 * mb + i % 2) * P_GROUP_BYTES + (2 * s + i // 2) * GMMA_CORE_BYTES
                    st_shared_b32(base + off, regs[i])

    @cute.jit
    def _widen_v(self, v_stage, vt_buf, wg, t):
        """v_operand="f16": thread t of warpgroup wg widens key t's e4m3 V values of the warpgroup's d half
        exactly to f16, into the M-major V^T operand (``f16_m_major_offset``; M rows relabeled as
        ``m_row_dim``, so a 16-wide d chunk's even dims form one 8-row group and its odd dims the next; K at
        ``f16_slot``). One 16-byte load, four byte permutes, eight cvt and two 16-byte stores per chunk."""
        d = self.d
        row_at = vt_buf + f16_m_major_offset(0, f16_slot(t))  # key t's K position, M group 0
        for cl in cutlass.range_constexpr(d // 2 // CHUNK):
            ch = wg * (d // 2 // CHUNK) + cl
            w = ld_shared_v4_b32(v_stage + t * d + ((ch ^ (t & 7)) * CHUNK))
            for par, sel in ((0, BYTES_EVEN), (1, BYTES_ODD)):
                e0, e1 = e4m3x4_to_pairs(prmt(w[0], w[1], sel), bf16=False)
                e2, e3 = e4m3x4_to_pairs(prmt(w[2], w[3], sel), bf16=False)
                st_shared_v4_b32(row_at + (2 * ch + par) * F16_GROUP_BYTES, e0, e1, e2, e3)

    # ------------------------------------------------------------------------------------------
    @cute.jit
    def _wg_epilogue(self, row_sum, m_prev, o_acc, s_sum, l_buf, mO, mLSE, mOp, mMp, mLp, mNSplits, seq, slot, hb,
                     head, b, h_k, n_q, n_base, o_seq, lse_scale, v_descale, scale_o, warp, wg, wq, g, c,
                     key_warp):  # fmt: skip
        """Row sums in the Thor kernel's order (as ``HopperDecodeKernel._epilogue``), then O and LSE or
        the fp32 partials; this thread holds O^T at d = 16 chunk + 2g, + 1 for rows 2c, 2c + 1, 8 + 2c,
        9 + 2c."""
        i64 = cutlass.Int64
        lane = cute.arch.lane_idx()
        cute.arch.sync_threads()
        for e in cutlass.range_constexpr(8):
            row = 2 * c + (e & 1) + 8 * (e >> 2)
            key = key_warp + g + 8 * ((e >> 1) & 1)
            st_shared_f32(l_buf + (row * TILE_KEYS + key) * 4, row_sum[e])
        self._row_sum_tree(l_buf, s_sum, warp * 32 + lane)

        out_scale, part_scale, n_splits = self._epilogue_scales(scale_o, v_descale, mNSplits, seq)
        o_base = mO.iterator.toint()
        op_base = mOp.iterator.toint()
        d = self.d
        for r in cutlass.range_constexpr(4):
            row = 2 * c + (r & 1) + 8 * (r >> 1)
            n = n_base + row
            if n < n_q:
                norm, row_off = self._finish_row(
                    row, n, m_prev[r], s_sum, warp == 0 and g == 0, lse_scale, out_scale, n_splits, mLSE, mMp, mLp,
                    hb, slot, seq, head, n_q, o_seq,
                )  # fmt: skip
                e = (r & 1) + 4 * (r >> 1)
                for mb in cutlass.range_constexpr(self.m_blocks):
                    dd = (wg * (d // 2 // CHUNK) + mb * (64 // CHUNK) + wq) * CHUNK + 2 * g
                    v0 = o_acc[8 * mb + e]  # d = dd
                    v1 = o_acc[8 * mb + e + 2]  # d = dd + 1
                    if n_splits == 1:
                        st_global_b32(o_base + (row_off + i64(dd)) * 2, f32x2_to_bf16_pair(v0 * norm, v1 * norm))
                    else:
                        p_off = self._partial_offset(slot, seq, head, n, b, h_k, n_q)
                        st_global_v2_f32(op_base + (p_off + i64(dd)) * 4, v0 * part_scale, v1 * part_scale)
