"""Compile key of the Hopper (sm_90a) decode kernel, its resource plan and ``can_implement``.

No cutlass import: configs are validated before anything compiles (CI, ``decode()``).

The Hopper kernel computes what the Thor kernel computes (NUMERICS.md section 5) with warp-level
``mma.sync`` instead of tcgen05. Every KV value enters the MMA as an exact 16-bit value (f16 on the
e4m3-Q path: e4m3 Q, K, V and P = e4m3(p * 448) are all f16 values; bf16 on the bf16-Q path; e2m1, e3m2
and e2m3 K and V enter as value * 2^-k and Q and P as value * 2^k, so every product is the same), and each
128-key tile's products are added to fp32 accumulators, so no contraction is longer than one tile
(NUMERICS.md section 4). Hopper's native fp8 MMA (wgmma, with the keys on M since decode has 4-16 query
rows) was built too (``mma="wgmma"``): its sums are not exact (about 2^-10 of sum |a b|) and it was not
faster, so it stays an experimental option.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mjolnir_numerics.cache import PAGE_SIZES
from mjolnir_numerics.emulator import KERNEL_P_SCALE
from mjolnir_numerics.formats import FORMATS
from mjolnir_numerics.plan import TILE_KEYS

# sm_90 has the same shared memory as sm_100 / sm_110: 228 KiB per SM, 227 KiB per CTA, 1 KiB reserved
from ..config import SMEM_PER_CTA_MAX, SMEM_PER_SM, SMEM_RESERVED_PER_CTA, ConfigError

# ---------------------------------------------------------------------------------------------
# Tuning block
# ---------------------------------------------------------------------------------------------
THREADS = 256  # eight warps: S by keys (16 per warp), P.V by head-dim slices (d / 8 per warp)
WARPS = THREADS // 32
Q_TILE = 16  # query rows per CTA: the M of mma.m16n8k16 (n_q > 16 tiles over gridDim.y)
P_ROW_PAD = 8  # 16-bit elements of padding per P row in smem (ldmatrix rows on distinct banks)
# KV tiles in the cp.async ring: 2 beat 3 on the H200 at d = 128 (more CTAs per SM) and tie at d = 256
# (python -m benchmarks.bench_hopper_decode --stages 2,3)
DEFAULT_STAGES = 2
MAX_SPLITS_LIMIT = 64
MAX_CTAS_LIMIT = 4  # ctas= at most this (4 x 256 threads leave 64 registers per thread)
MAX_CTAS_PER_SM = 2  # register budget: 2 CTAs of 256 threads at <= 128 registers (d = 128 needs ~125)
MAX_CTAS_PER_SM_D256 = 1  # d = 256 needs 180-255 registers (2 CTAs would spill where shared memory allows them)
# ---------------------------------------------------------------------------------------------

KV_FORMATS = tuple(FORMATS)  # e4m3 read directly; fp6 / fp4 / nvfp4 converted to e4m3 in shared memory
Q_DTYPES = ("bf16", "e4m3")
HEAD_DIMS = (128, 256)
MMA_KINDS = ("sync", "wgmma")
LOAD_KINDS = ("cp_async", "bulk", "tma")
MERGE_KINDS = ("kernel", "fused")
KV_CONVERTS = ("auto", "exact", "scaled")  # how sub-byte codes become e4m3 bytes (HopperConfig.kv_convert)
SCALED_KV_FORMATS = ("e2m1", "e3m2", "e2m3")  # the formats whose values times 2^-k are their bits, placed
K_OPERANDS = ("auto", "tile", "registers")  # where packed K becomes MMA fragments (HopperConfig.k_operand)
V_CONVERTS = ("auto", "early", "late")  # when the registers path converts V's tile (HopperConfig.v_convert)
SCHEDULES = ("auto", "serial", "overlap")  # the tile loop's phase order (HopperConfig.schedule)
MMA_LAYOUTS = ("auto", "rows", "keys")  # what the mma.sync M dimension holds (HopperConfig.mma_layout)
V_OPERANDS = ("registers", "smem", "f16")  # how the wgmma path makes V^T K-major (HopperConfig.v_operand)
PREFETCH_SIZES = (0, 64, 128, 256)  # L2 prefetch-size hints of cp.async (.L2::64B / 128B / 256B)
BULK_ROW_PAD = 16  # bytes after each key row of a bulk-loaded ring stage (ldmatrix rows on distinct banks)


@dataclass(frozen=True)
class HopperConfig:
    """Compile key of the Hopper decode kernel.

    Fields:
      head_dim    d: 128 or 256
      page_size   keys per page: 16, 32, 64 or 128 (paging is runtime addressing; the size shapes masks)
      q_len       query tokens per sequence (>= 1)
      kv_format   KV cache format (see ``KV_FORMATS``)
      q_dtype     "bf16" (bf16 MMA, P = bf16(p)) or "e4m3" (f16 MMA on e4m3 values, P = e4m3(p * 448))
      causal      q_len > 1: query qi sees keys 0 .. L - q_len + qi (False: all L keys)
      max_splits  partial slots per sequence; 1 compiles the reduction out
      stages      KV tiles in the shared-memory ring; 0 = DEFAULT_STAGES
      pdl         programmatic dependent launch: the decode grid waits for the previous grid
                  (griddepcontrol); with merge="kernel" the reduction grid launches while the decode grid
                  runs and waits for it, hiding its launch latency
      merge       how a split sequence's partials become O and LSE: "kernel" (default: a second grid,
                  ``SplitReduction``, as on Thor) or "fused" (the last CTA of a (sequence, KV head, query
                  tile) to finish, counted by an atomic per triple, merges them in the decode grid: one
                  grid, no faster on the H200, ``python -m benchmarks.bench_hopper_decode --merge
                  fused,kernel``); the same arithmetic, bit-identical
      q_rows      16, or 8 when the problem has n_q = q_len * h_r <= 8 query rows per KV head (GQA decode
                  at h_q / h_k <= 8): rows 8-15 of the 16-row tile are padding, so the softmax, row sums
                  and O rescale skip them (``decode()`` picks it; mma.sync only)
      ctas        co-resident CTAs per SM to compile for (min_blocks_per_mp, and the plan's occupancy):
                  0 = what shared memory allows, at most MAX_CTAS_PER_SM; 3 caps registers at 85 per thread
      loads       how KV tiles reach shared memory: "cp_async" (default; 16-byte copies by every thread, a
                  swizzled tile), "bulk" (e4m3 KV, mma.sync only: one ``cp.async.bulk`` per key row by the
                  copy engine, completion on an mbarrier per ring stage; rows padded by BULK_ROW_PAD bytes
                  instead of swizzled; 0.64-0.94x the cp.async speed) or "tma" (e4m3 KV, mma.sync only: one
                  tensor-map TMA box per page and 128 bytes of head dim, swizzled by the hardware, issued
                  by one elected lane of warp 0; mbarriers as for bulk; 0.91-0.99x the cp.async speed,
                  ``python -m benchmarks.bench_hopper_decode --formats e4m3 --loads cp_async,tma``)
      prefetch    L2 prefetch-size hint of the cp.async KV loads in bytes: 0 (none), 64, 128 or 256
      evict_first the KV loads carry an L2 evict-first cache policy (KV is read once; default on:
                  geometric mean 1.02x over 44 shapes, 1.16x at batch 1 with 32K keys, 0.95-1.05x
                  elsewhere, ``python -m benchmarks.bench_hopper_decode --l2-hints ef,none`` on the H200)
      mma         "sync" (default): warp-level mma.sync on exactly widened f16 / bf16 values; "wgmma":
                  EXPERIMENTAL warpgroup fp8 MMAs with the keys on M (e4m3 Q only; e4m3 bytes straight
                  into the tensor cores), not bit-faithful: Hopper's fp8 MMAs do not add exactly
                  (``wgmma_kernel.py``)
      v_operand   mma="wgmma" only: how V (stored d-contiguous) becomes the A operand V^T of O^T = V^T.P^T,
                  which fp8 wgmma reads only K-major (keys contiguous): "registers" (default:
                  ``ldmatrix.trans`` and two byte permutes per register, A from registers), "smem" (those
                  fragments stored once per tile into a K-major V^T tile in shared memory, both operands
                  from shared memory) or "f16" (V widened exactly to f16 in shared memory, which the 16-bit
                  wgmma reads M-major, and P as f16: an f16 P.V). On the H200 registers are the fastest
                  or within 1 % of it: "smem" 0.89x at d = 128, 0.99-1.01x at d = 256 (the same bits),
                  "f16" 0.69-0.77x (``python -m benchmarks.bench_hopper_decode --mma wgmma --v-operand
                  registers,smem,f16``)
      kv_convert  how packed sub-byte codes become the e4m3 bytes of the MMA tiles: "exact" (each byte is
                  the code's value: a byte-permute table for e2m1, an f16 multiply and e4m3 rounding for
                  fp6), "scaled" (e2m1, e3m2, e2m3 with mma.sync: each byte is value * 2^-k, the code's
                  bits shifted into place, and Q and P are multiplied by 2^k so every product is the
                  same; the same bits, fewer instructions) or "auto" (default: "scaled" where it
                  applies, else "exact"; NVFP4 always uses its table)
      k_operand   sub-byte K with mma.sync: "tile" (all warps convert the K tile to e4m3 bytes in shared
                  memory, then every warp reads its keys by ``ldmatrix``: a store, a load and a block
                  barrier per tile) or "registers" (each warp loads its own 16 keys' packed codes and
                  converts them straight into its MMA fragments; only V goes through an e4m3 tile, and its
                  barrier is the row-max barrier). The head-dim order inside the MMAs differs (a
                  relabeling: the spec's sum is order-free), so the fp32 sums may differ in the last
                  bits (on the 10 sub-byte conformance cases they did not). "auto" (default) picks
                  "registers" for the scaled formats and for NVFP4 at d = 256, "tile" for NVFP4 at
                  d = 128 and the exact conversion: on the H200, back to back at batch 8 / 32, registers
                  run e2m1 1.03-1.07x, e3m2 0.99-1.10x, e2m3 1.00-1.06x, NVFP4 0.97-0.98x at d = 128 and
                  1.06x at d = 256 (with V converted late; the tile path also spills 8-28 bytes there)
                  (``python -m benchmarks.bench_hopper_decode --k-operand tile,registers``)
      v_convert   with K in registers, when the warps convert V's tile (both before the row-max barrier
                  that completes it): "early" (right after the ring's barrier, before K's codes) or "late"
                  (after the QK MMAs are issued, so the conversion fills their latency); "auto" (default)
                  is "late" at d = 256 and "early" at d = 128, as measured on the H200 back to back at
                  batch 8 / 32: late runs 1.00-1.06x at d = 256 and 0.97-1.00x at d = 128
                  (``python -m benchmarks.bench_hopper_decode --v-convert early,late``)
      schedule    with K in registers, the tile loop's phases: "serial" (per tile: S, the row-max
                  barrier, softmax, a barrier, P.V) or "overlap" (P.V of tile i and S of tile i + 1
                  between the same two barriers, so each warp's instruction stream interleaves them; a
                  second e4m3 V tile of shared memory; the same bits); "auto" (default) is "overlap" for
                  e2m1 and "serial" for e3m2 / e2m3, as measured on the H200: overlap ran e2m1 1.01-1.04x
                  back to back at batch 8 / 32 and 1.00-1.08x in single calls at batch 1 / 8 / 32, fp6
                  0.98-1.07x and 0.95-1.05x (``python -m benchmarks.bench_hopper_decode --schedule
                  serial,overlap``); fp6 overlapped at d = 128 spills 4-8 bytes
      mma_layout  with K in registers, e4m3 Q and q_rows=8: "rows" (query rows on the MMA's M = 16,
                  rows 8-15 padding) or "keys" (S^T = K.Q^T with 16 keys on M and the 8 query rows on N,
                  O^T = V^T.P^T with 16 head dims on M: half the MMAs, no padding rows, about 20 fewer
                  registers, the same bits); "auto" (default) is "rows": keys measured 0.91-1.05x of it on
                  the H200 back to back at batch 8 / 32, also with 3 CTAs per SM at d = 128 and 2 at
                  d = 256 (``python -m benchmarks.bench_hopper_decode --mma-layout rows,keys``)
    """

    head_dim: int = 128
    page_size: int = 128
    q_len: int = 1
    kv_format: str = "e4m3"
    q_dtype: str = "bf16"
    causal: bool = True
    max_splits: int = 16
    stages: int = 0
    pdl: bool = False
    mma: str = "sync"
    q_rows: int = Q_TILE
    ctas: int = 0
    loads: str = "cp_async"
    prefetch: int = 0
    evict_first: bool = True
    merge: str = "kernel"
    v_operand: str = "registers"
    kv_convert: str = "auto"
    k_operand: str = "auto"
    v_convert: str = "auto"
    schedule: str = "auto"
    mma_layout: str = "auto"

    def key(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def short_name(self) -> str:
        """``sm90-bf16-e4m3-d128-ps128-q1c-s16-r3``."""
        causal = "c" if self.causal else "n"
        return (
            f"sm90-{self.q_dtype}-{self.kv_format}-d{self.head_dim}-ps{self.page_size}-q{self.q_len}{causal}"
            f"-s{self.max_splits}-r{self.ring_stages}"
            + ("-pdl" if self.pdl else "")
            + ("-wg" if self.mma == "wgmma" else "")
            + ("-h8" if self.q_rows == 8 else "")
            + (f"-c{self.ctas}" if self.ctas else "")
            + (f"-{self.loads}" if self.loads != "cp_async" else "")
            + (f"-pf{self.prefetch}" if self.prefetch else "")
            + ("" if self.evict_first else "-noef")
            + ("-fm" if self.merge == "fused" else "")
            + ({"smem": "-vs", "f16": "-vf16"}.get(self.v_operand, ""))
            + ({"exact": "-kx", "scaled": "-ks"}.get(self.kv_convert, ""))
            + ({"tile": "-kt", "registers": "-kr"}.get(self.k_operand, ""))
            + ({"early": "-ve", "late": "-vl"}.get(self.v_convert, ""))
            + ({"serial": "-ts", "overlap": "-to"}.get(self.schedule, ""))
            + ({"rows": "-mr", "keys": "-mk"}.get(self.mma_layout, ""))
        )

    # -- derived ------------------------------------------------------------------------------
    @property
    def fp8(self) -> bool:
        return self.q_dtype == "e4m3"

    @property
    def q_tile(self) -> int:
        return Q_TILE

    @property
    def p_scale(self) -> float:
        return KERNEL_P_SCALE if self.fp8 else 1.0

    @property
    def ring_stages(self) -> int:
        return self.stages or DEFAULT_STAGES

    @property
    def packed(self) -> bool:
        """True for sub-byte formats: the ring holds packed codes, converted to e4m3 per tile."""
        return self.kv_format != "e4m3"

    @property
    def scaled_kv(self) -> bool:
        """The packed codes become e4m3 bytes of value * 2^-k by bit placement, and Q and P are multiplied
        by 2^k (``kv_convert``; "auto" picks it wherever it applies: e2m1, e3m2 and e2m3 with mma.sync)."""
        applies = self.kv_format in SCALED_KV_FORMATS and self.mma == "sync"
        return applies and self.kv_convert != "exact"

    @property
    def k_registers(self) -> bool:
        """Packed K goes from the ring stage straight into each warp's MMA fragments (``k_operand``; "auto"
        picks it for the scaled conversion and for NVFP4 at d = 256)."""
        if not self.packed or self.mma != "sync":
            return False
        auto = self.scaled_kv or (self.kv_format == "nvfp4" and self.head_dim == 256)
        return self.k_operand == "registers" or (self.k_operand == "auto" and auto)

    @property
    def v_late(self) -> bool:
        """With K in registers, V's tile is converted after the QK MMAs are issued (``v_convert``)."""
        if not self.k_registers:
            return False
        return self.v_convert == "late" or (self.v_convert == "auto" and self.head_dim == 256)

    @property
    def overlap(self) -> bool:
        """P.V of a tile and S of the next run between the same barriers (``schedule``; "auto" picks it for
        e2m1 with K in registers)."""
        if not self.k_registers:
            return False
        return self.schedule == "overlap" or (self.schedule == "auto" and self.kv_format == "e2m1")

    @property
    def keys_on_m(self) -> bool:
        """S^T = K.Q^T and O^T = V^T.P^T with the query rows on N (``mma_layout="keys"``)."""
        return self.mma_layout == "keys" and self.k_registers and self.q_rows == 8 and self.fp8

    @property
    def tile_bytes(self) -> int:
        """Bytes of one 128-key tile of K (or V) as the MMA reads it (one e4m3 byte per element)."""
        return TILE_KEYS * self.head_dim

    @property
    def fused_merge(self) -> bool:
        """Split sequences are merged inside the decode grid (no reduction grid)."""
        return self.max_splits > 1 and self.merge == "fused"

    @property
    def bulk(self) -> bool:
        return self.loads == "bulk"

    @property
    def mbarrier_ring(self) -> bool:
        """The ring's stages complete on mbarriers (bulk copies or TMA) instead of cp.async groups."""
        return self.loads in ("bulk", "tma")

    @property
    def ring_row_bytes(self) -> int:
        """Bytes from one key row of a ring stage to the next: packed rows for sub-byte formats, d e4m3
        bytes (swizzled) for cp.async, d + BULK_ROW_PAD for bulk copies."""
        if self.packed:
            return self.packed_row_bytes
        return self.head_dim + (BULK_ROW_PAD if self.bulk else 0)

    @property
    def packed_row_bytes(self) -> int:
        """Bytes of one key row as stored (d * bits / 8)."""
        return self.head_dim * FORMATS[self.kv_format].bits // 8

    @property
    def smem_bytes(self) -> int:
        p = Q_TILE * (TILE_KEYS + P_ROW_PAD) * 2
        if self.mma == "wgmma":  # P (e4m3, or f16 for v_operand="f16") and Q tiles in the wgmma operand layout
            p = Q_TILE * TILE_KEYS * (2 if self.v_operand == "f16" else 1) + Q_TILE * self.head_dim
            p += self.v_operand_bytes
        stats = 2 * WARPS * Q_TILE * 4
        if self.packed:  # packed ring + the converted V tile(s) (and K tile, unless K goes to registers)
            ring = (
                2 * self.ring_stages * TILE_KEYS * self.packed_row_bytes
                + (1 + (not self.k_registers) + self.overlap) * self.tile_bytes
            )
            if self.kv_format == "nvfp4":  # block-scale rows of each stage
                ring += 2 * self.ring_stages * TILE_KEYS * (self.head_dim // 16)
        else:
            ring = 2 * self.ring_stages * TILE_KEYS * self.ring_row_bytes
            if self.mbarrier_ring:  # one mbarrier per stage
                ring += 8 * self.ring_stages
            if self.loads == "tma":  # the K and V rings aligned to 1024 bytes (the swizzle's period)
                ring += 2 * 1024
        return ring + p + stats + 512

    @property
    def v_operand_bytes(self) -> int:
        """Shared memory of the wgmma path's V^T tile: none in registers, d x 128 e4m3 bytes for "smem",
        twice that in f16 for "f16"."""
        return {"smem": 1, "f16": 2}.get(self.v_operand, 0) * self.tile_bytes

    @property
    def ctas_per_sm(self) -> int:
        """Co-resident CTAs (the plan's occupancy and the launch's min_blocks_per_mp): ``ctas`` when set,
        else what shared memory allows, at most MAX_CTAS_PER_SM (which caps registers at 65536 / (256 * 2)
        = 128 per thread; at d = 256, MAX_CTAS_PER_SM_D256)."""
        if self.ctas:
            return self.ctas
        regs_limit = MAX_CTAS_PER_SM_D256 if self.head_dim == 256 else MAX_CTAS_PER_SM
        return max(1, min(regs_limit, self.smem_ctas_limit))

    @property
    def smem_ctas_limit(self) -> int:
        """CTAs of this config that shared memory can hold on one SM."""
        return SMEM_PER_SM // (self.smem_bytes + SMEM_RESERVED_PER_CTA)


def can_implement_hopper(c: HopperConfig) -> None:
    """Raise ConfigError naming every field the Hopper kernel cannot implement."""
    if not isinstance(c, HopperConfig):
        raise ConfigError(f"config: expected a HopperConfig, got {type(c).__name__}")
    problems = []
    if c.head_dim not in HEAD_DIMS:
        problems.append(f"head_dim={c.head_dim!r} (allowed {HEAD_DIMS})")
    if c.page_size not in PAGE_SIZES:
        problems.append(f"page_size={c.page_size!r} (allowed {PAGE_SIZES})")
    if isinstance(c.q_len, bool) or not isinstance(c.q_len, int) or c.q_len < 1:
        problems.append(f"q_len={c.q_len!r} (an int >= 1)")
    if c.kv_format not in FORMATS:
        problems.append(f"kv_format={c.kv_format!r} (allowed {tuple(FORMATS)})")
    if c.q_dtype not in Q_DTYPES:
        problems.append(f"q_dtype={c.q_dtype!r} (allowed {Q_DTYPES})")
    elif c.kv_format != "e4m3" and c.q_dtype != "e4m3":
        problems.append(f"q_dtype={c.q_dtype!r} with kv_format={c.kv_format!r} (needs e4m3 Q)")
    if not isinstance(c.max_splits, int) or not 1 <= c.max_splits <= MAX_SPLITS_LIMIT:
        problems.append(f"max_splits={c.max_splits!r} (1 .. {MAX_SPLITS_LIMIT})")
    if not isinstance(c.stages, int) or c.stages < 0 or c.stages == 1:
        problems.append(f"stages={c.stages!r} (0 = default, or >= 2)")
    elif not problems and c.smem_bytes > SMEM_PER_CTA_MAX:
        problems.append(f"stages={c.stages!r}: {c.smem_bytes} B of shared memory > {SMEM_PER_CTA_MAX} B per CTA")
    if c.mma not in MMA_KINDS:
        problems.append(f"mma={c.mma!r} (allowed {MMA_KINDS})")
    elif c.mma == "wgmma" and c.q_dtype != "e4m3":
        problems.append(f"mma='wgmma' with q_dtype={c.q_dtype!r} (the fp8 warpgroup MMA needs e4m3 Q)")
    if not isinstance(c.ctas, int) or isinstance(c.ctas, bool) or not 0 <= c.ctas <= MAX_CTAS_LIMIT:
        problems.append(f"ctas={c.ctas!r} (0 = auto, or 1 .. {MAX_CTAS_LIMIT})")
    elif not problems and c.ctas > c.smem_ctas_limit:
        problems.append(f"ctas={c.ctas}: {c.ctas} x {c.smem_bytes} B of shared memory do not fit one SM")
    if c.loads not in LOAD_KINDS:
        problems.append(f"loads={c.loads!r} (allowed {LOAD_KINDS})")
    elif c.loads != "cp_async" and (c.kv_format != "e4m3" or c.mma != "sync"):
        problems.append(
            f"loads={c.loads!r} with kv_format={c.kv_format!r}, mma={c.mma!r} (needs e4m3 KV and mma='sync')"
        )
    if c.prefetch not in PREFETCH_SIZES or isinstance(c.prefetch, bool):
        problems.append(f"prefetch={c.prefetch!r} (allowed {PREFETCH_SIZES})")
    elif c.prefetch and c.loads != "cp_async":
        problems.append(f"prefetch={c.prefetch} with loads={c.loads!r} (a cp.async hint)")
    if not isinstance(c.evict_first, bool):
        problems.append(f"evict_first={c.evict_first!r} (True or False)")
    if c.q_rows not in (8, Q_TILE):
        problems.append(f"q_rows={c.q_rows!r} (8 or {Q_TILE})")
    elif c.q_rows == 8 and c.mma == "wgmma":
        problems.append("q_rows=8 with mma='wgmma' (the wgmma path computes all 16 rows)")
    if c.v_operand not in V_OPERANDS:
        problems.append(f"v_operand={c.v_operand!r} (allowed {V_OPERANDS})")
    elif c.v_operand != "registers" and c.mma != "wgmma":
        problems.append(f"v_operand={c.v_operand!r} with mma={c.mma!r} (needs mma='wgmma')")
    if c.kv_convert not in KV_CONVERTS:
        problems.append(f"kv_convert={c.kv_convert!r} (allowed {KV_CONVERTS})")
    elif c.kv_convert == "scaled" and (c.kv_format not in SCALED_KV_FORMATS or c.mma != "sync"):
        problems.append(
            f"kv_convert='scaled' with kv_format={c.kv_format!r}, mma={c.mma!r} (needs one of {SCALED_KV_FORMATS}"
            " and mma='sync')"
        )
    if c.k_operand not in K_OPERANDS:
        problems.append(f"k_operand={c.k_operand!r} (allowed {K_OPERANDS})")
    elif c.k_operand == "registers" and (not c.packed or c.mma != "sync"):
        problems.append(
            f"k_operand='registers' with kv_format={c.kv_format!r}, mma={c.mma!r} (needs a sub-byte format and"
            " mma='sync')"
        )
    if c.v_convert not in V_CONVERTS:
        problems.append(f"v_convert={c.v_convert!r} (allowed {V_CONVERTS})")
    elif c.v_convert != "auto" and c.k_operand in K_OPERANDS and not c.k_registers:
        problems.append(
            f"v_convert={c.v_convert!r} with k_operand={c.k_operand!r} (needs K in registers: a sub-byte"
            " format, mma='sync' and k_operand='registers', or 'auto' for e2m1 / e3m2 / e2m3)"
        )
    if c.schedule not in SCHEDULES:
        problems.append(f"schedule={c.schedule!r} (allowed {SCHEDULES})")
    elif c.schedule == "overlap" and c.k_operand in K_OPERANDS and not c.k_registers:
        problems.append(
            f"schedule='overlap' with k_operand={c.k_operand!r} (needs K in registers: a sub-byte format,"
            " mma='sync' and k_operand='registers', or 'auto' for e2m1 / e3m2 / e2m3)"
        )
    if c.mma_layout not in MMA_LAYOUTS:
        problems.append(f"mma_layout={c.mma_layout!r} (allowed {MMA_LAYOUTS})")
    elif c.mma_layout == "keys" and not problems and not c.keys_on_m:
        problems.append(
            f"mma_layout='keys' with kv_format={c.kv_format!r}, q_dtype={c.q_dtype!r}, q_rows={c.q_rows!r},"
            f" k_operand={c.k_operand!r} (needs K in registers, e4m3 Q and q_rows=8: at most 8 query rows per KV head)"
        )
    if c.merge not in MERGE_KINDS:
        problems.append(f"merge={c.merge!r} (allowed {MERGE_KINDS})")
    if not isinstance(c.pdl, bool):
        problems.append(f"pdl={c.pdl!r} (True or False)")
    if problems:
        raise ConfigError("HopperConfig cannot be implemented: " + "; ".join(problems))
