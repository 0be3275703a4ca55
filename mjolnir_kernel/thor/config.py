"""The compile key of the Thor decode kernel: a frozen config, its derived quantities, ``can_implement``.

No cutlass import: CI and ``decode()`` validate a config before anything compiles.

A config fixes everything the kernel is specialized on. The per-call problem (batch, sequence lengths,
heads, pages, strides, descales) is runtime data; only the head dim, the query-row tile and the page
size shape the tiles, and ``q_len``/``causal`` shape the mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

# The numerics the kernel shares with the spec come from the spec: one definition each.
from mjolnir_numerics.capability import unsupported_reason
from mjolnir_numerics.emulator import KERNEL_P_SCALE as FP8_P_SCALE  # P stored as e4m3(p * 448) on the fp8 path
from mjolnir_numerics.formats import FORMATS, NVFP4
from mjolnir_numerics.nvfp4 import KERNEL_SHIFT as NVFP4_SHIFT  # noqa: F401 (re-exported: e4m3(code * scale / 8))
from mjolnir_numerics.plan import TILE_KEYS  # keys per KV tile (= GEMM1 M)
from mjolnir_numerics.targets import THOR

from ..errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Tuning block: every magic number of the kernel's resource plan lives here.
# ---------------------------------------------------------------------------------------------
MMA_M = 128  # tcgen05 cta_group::1 M
MMA_K = 128  # head-dim elements per MMA stage (one 128-B swizzle atom of 8-bit data)
WARP_THREADS = 32
WARPGROUP_THREADS = 128
REGISTER_FILE = 64 * 1024  # 32-bit registers per SM
MAX_REGS_PER_THREAD = 255
TMEM_COLUMNS = 512  # tensor-memory columns per SM, shared by the resident CTAs
TMEM_MIN_ALLOC = 32  # tcgen05.alloc: power of two >= 32 columns
SMEM_PER_SM = THOR.smem_per_sm
SMEM_PER_CTA_MAX = THOR.smem_per_cta
SMEM_RESERVED_PER_CTA = THOR.smem_reserved_per_cta
SMEM_BARRIER_BYTES = 768  # mbarriers + tmem pointer
SWIZZLE_ALIGN = 1024  # SW128 atoms repeat every 1024 B; TMA and UMMA descriptors assume it
COL_MAX_BUFFERS = 2  # running-column-max buffers in smem, by tile parity (decode_kernel says why)
SP_STAGES = 2  # S/P double buffer (GEMM1 of tile s + 1 overlaps softmax of tile s)
O_STAGES = 1
MAX_CVT_STAGES = {8: 8, 16: 8, 32: 4}  # bf16 path TMEM cvt ring cap, by query-row tile
# Register split between warp roles when the softmax warpgroup gets more (setmaxnreg): the MMA/TMA
# warps need few; 2 CTAs/SM with a convert warpgroup is the tight case (pool of 240 per thread of a
# warpgroup): the MMA/TMA warps get 56 there and softmax keeps >= 96 (104).
MMA_TMA_REGS = 72
MMA_TMA_REGS_TIGHT = 56
CVT_REGS = {1: 112, 2: 88}  # convert warpgroup, by CTAs per SM
SOFTMAX_MIN_REGS = 96
# Default KV ring depth: a whole number of KV tiles, 1 tile at 2 CTAs/SM, 2 tiles at 1 CTA/SM; fp6 at
# 2 CTAs/SM and d = 256: 2 stages. These are the seed kernel's measurements on Thor (Nsight Compute,
# cold L2, d = 256: at 2 CTAs/SM depth 4 beat 2, 3, 5 and 6 at 8K / 64K / 256K keys, at 1 CTA/SM depth
# 8 beat 13; fp6 depth 2 beat 3 by 11-14 % at 64K-256K keys). This kernel has not run on Thor, so they
# are the best values known, not values measured for it.
DEFAULT_RING_TILES = {1: 2, 2: 1}
FP6_RING_2CTA_D256 = 2
NVFP4_PACKED_STAGES = 2  # packed e2m1 tiles in flight (one K, one V)
EVICT_FIRST_POLICY = 0x12F0000000000000  # CUTLASS CacheHintSm90::EVICT_FIRST L2 policy word
MAX_SPLITS_LIMIT = 64  # the reduction unrolls over max_splits
# ---------------------------------------------------------------------------------------------


def default_ctas(target_ctas: int, q_tile: int, q_dtype: str, kv_format: str) -> int:
    """CTAs per SM the default config compiles: the target's, except 1 for a 32-row query tile with a
    convert warpgroup (bf16 Q, or NVFP4 KV). At 2 CTAs per SM those configs' three warpgroups share 240
    registers per thread slot (80 each at launch), and the 32-row tile needs about 128 for softmax, 80 for
    the convert warpgroup and 40 for the MMA/TMA warps: every setmaxnreg split of 240 spilled 24-432 bytes
    on sm_110a (the sweep of 2026-12-02, reports/thor/2026-12-02-spills.md), while 1 CTA per SM (168) spills
    nothing. The split plan keeps the target's occupancy (a plan is valid for any residency; the kernel and
    ``emulate_decode`` make the same one)."""
    has_convert = q_dtype == "bf16" or kv_format == "nvfp4"
    return 1 if (target_ctas == 2 and q_tile > 16 and has_convert) else target_ctas


NVFP4_GROUP = NVFP4.group
KV_FORMATS = tuple(FORMATS)
KV_FORMAT_BITS = {name: fmt.bits for name, fmt in FORMATS.items()}
Q_DTYPES = ("bf16", "e4m3")
Q_TILES = THOR.q_tiles


@dataclass(frozen=True)
class ThorConfig:
    """Compile key of the Thor (tcgen05) decode kernel.

    Fields (the problem's shape, a feature, then the two tuning knobs):
      head_dim      head dimension d (elements), 128 or 256
      q_tile        query rows per CTA (q_len * h_r rows of one KV head, tiled),
                    ``mjolnir_numerics.targets.THOR.q_tile(n_q, q_dtype)``: 8, 16 or 32; the fully-fp8
                    MMA needs 16 or 32
      page_size     keys per KV-cache page: 16, 32, 64 or 128
      q_len         query tokens per sequence (>= 1; > 1 for speculative decoding)
      kv_format     "e4m3" (both paths), "e3m2" / "e2m3" / "e2m1" (read directly by the MMA),
                    "nvfp4" (converted to e4m3 in shared memory); all but e4m3 need e4m3 Q
      q_dtype       "bf16" (KV converted to bf16 in tensor memory) or "e4m3" (fully fp8)
      causal        q_len > 1: query qi sees keys 0 .. L - q_len + qi (False: all L keys)
      max_splits    partial slots per sequence; 1 compiles the reduction out (every sequence unsplit)
      pdl           programmatic dependent launch for the decode and reduction grids (a feature for
                    callers that chain kernels)
      ctas_per_sm   co-resident CTAs per SM (1 or 2); each gets 1/ctas of smem, TMEM, registers.
                    Default: the Thor target's, 2 (the seed kernel measured 2 faster than 1 on Thor);
                    ``default_config`` takes 1 where 2 would spill (:func:`default_ctas`)
      ring_stages   KV shared-memory ring stages of 16 KiB (one 128 x 128 byte MMA operand block);
                    0 = the default of the tuning block (the seed kernel's measurements on Thor)

    This kernel has not run on Thor: the two tuning knobs stay so that the first Thor run can sweep
    them (``python -m mjolnir_kernel bench --ctas-per-sm 1,2 --ring-stages ...``).
    """

    head_dim: int = 128
    q_tile: int = 16
    page_size: int = 128
    q_len: int = 1
    kv_format: str = "e4m3"
    q_dtype: str = "bf16"
    causal: bool = True
    max_splits: int = 16
    pdl: bool = False
    ctas_per_sm: int = THOR.ctas(128)
    ring_stages: int = 0
    derived: "Derived" = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self):
        try:
            derived = Derived.of(self)
        except (TypeError, ValueError, KeyError, ZeroDivisionError):
            problems = _field_problems(self)  # name the fields a derived quantity cannot be computed from
            if problems:
                raise ConfigError("ThorConfig cannot be implemented: " + "; ".join(problems)) from None
            raise
        object.__setattr__(self, "derived", derived)

    # -- naming -----------------------------------------------------------------------------
    def key(self) -> tuple:
        """The compile-key fields as a tuple (hashable, stable order)."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.compare)

    def short_name(self) -> str:
        """A compact, unique, filesystem-safe name: ``bf16-e4m3-d128-t16-ps128-q1c-c2-r0-s16``."""
        parts = [
            self.q_dtype,
            self.kv_format,
            f"d{self.head_dim}",
            f"t{self.q_tile}",
            f"ps{self.page_size}",
            f"q{self.q_len}{'c' if self.causal else 'n'}",
            f"c{self.ctas_per_sm}",
            f"r{self.ring_stages}",
            f"s{self.max_splits}",
        ]
        if self.pdl:
            parts.append("pdl")
        if self.evict_first:
            parts.append("ef")
        return "-".join(parts)

    @property
    def fp8(self) -> bool:
        """True on the fully-fp8 path (e4m3 Q)."""
        return self.q_dtype == "e4m3"

    @property
    def evict_first(self) -> bool:
        """K/V TMA loads carry an L2 EVICT_FIRST cache policy on the fp8-Q path (KV is read once; the
        seed kernel measured it faster there on Thor, and 4-18 % slower on the bf16-Q path at 32K-256K
        keys, which keeps the default policy)."""
        return self.fp8

    @property
    def kv_bits(self) -> int:
        return KV_FORMAT_BITS.get(self.kv_format, 8)

    @property
    def p_scale(self) -> float:
        """P is stored as e4m3(p * p_scale) on the fp8 path, bf16(p) on the bf16 path."""
        return FP8_P_SCALE if self.fp8 else 1.0


@dataclass(frozen=True)
class Derived:
    """Quantities derived from a config (plain ints; the kernel specializes on them).

    convert_warpgroups  warpgroups converting KV (bf16 path: e4m3 -> bf16 into TMEM; nvfp4: -> e4m3)
    threads             threads per CTA (softmax WG + convert WGs + one MMA/TMA WG)
    launch_regs         registers per thread ptxas may use at min_blocks_per_mp = ctas_per_sm
    reg_reconfig        warp roles re-balance registers with setmaxnreg
    softmax_regs, convert_regs, mma_tma_regs   setmaxnreg targets (when reg_reconfig)
    q_stages            head-dim stages of Q in smem (d / 128)
    stages_per_tile     KV ring stages one 128-key tile occupies (K: d/128, V: d/128)
    kv_stages           KV ring depth actually compiled
    cvt_stages          bf16 path: TMEM stages of converted K/V
    packed_stages       nvfp4: packed e2m1 tiles in smem
    tmem_cols_used, tmem_cols   tensor-memory columns used / allocated (power of two)
    smem_fixed_bytes    shared memory besides the KV ring
    smem_capacity       shared memory one CTA may use
    """

    convert_warpgroups: int
    threads: int
    launch_regs: int
    reg_reconfig: bool
    softmax_regs: int
    convert_regs: int
    mma_tma_regs: int
    q_stages: int
    stages_per_tile: int
    kv_stages: int
    max_kv_stages_fit: int
    cvt_stages: int
    packed_stages: int
    tmem_cols_used: int
    tmem_cols: int
    tmem_capacity: int
    smem_fixed_bytes: int
    smem_capacity: int

    @staticmethod
    def of(c: ThorConfig) -> "Derived":
        # Tolerate garbage here: can_implement reports it; derived values then are meaningless.
        d = c.head_dim if isinstance(c.head_dim, int) and c.head_dim > 0 else MMA_K
        n = c.q_tile if isinstance(c.q_tile, int) and c.q_tile > 0 else 16
        ctas = c.ctas_per_sm if c.ctas_per_sm in (1, 2) else 2
        fp8 = c.q_dtype == "e4m3"
        nvfp4 = c.kv_format == "nvfp4"
        q_bits = 8 if fp8 else 16

        if fp8:
            cvt_wgs = 1 if nvfp4 else 0
        else:
            cvt_wgs = 2 if (d > MMA_K and ctas == 1) else 1
        warpgroups = 2 + cvt_wgs
        threads = warpgroups * WARPGROUP_THREADS
        launch_regs = min(MAX_REGS_PER_THREAD, REGISTER_FILE // (threads * ctas)) // 8 * 8
        pool = launch_regs * warpgroups
        mma_tma = min(launch_regs, MMA_TMA_REGS_TIGHT if (ctas == 2 and cvt_wgs > 0) else MMA_TMA_REGS)
        cvt_regs = min(launch_regs, CVT_REGS[ctas])
        softmax = min(256, pool - mma_tma - cvt_regs * cvt_wgs) // 8 * 8
        # Re-balance (setmaxnreg) whenever the launch cap is tight: at 2 CTAs/SM (80 registers with a
        # convert warpgroup), for wide tiles (q_tile 32), and for nvfp4. Without it ptxas spills under
        # the uniform cap (seed: nvfp4 176 B, bf16 d128 8 B); with it the MMA/TMA warps hand their
        # registers to the softmax warpgroup.
        reg_reconfig = n > 16 or nvfp4 or ctas == 2

        q_stages = max(1, d // MMA_K)
        stages_per_tile = q_stages + max(1, d // MMA_M)

        tmem_used = n * SP_STAGES + n * O_STAGES * max(1, d // MMA_M)
        tmem_capacity = TMEM_COLUMNS // ctas
        if fp8:
            cvt_stages = 0
        else:
            stage_cols = MMA_K * q_bits // 32
            cvt_stages = max(0, min((tmem_capacity - tmem_used) // stage_cols, MAX_CVT_STAGES.get(n, 4)))
            tmem_used += cvt_stages * stage_cols
        tmem_cols = max(TMEM_MIN_ALLOC, 1 << math.ceil(math.log2(max(1, tmem_used))))

        packed_stages = NVFP4_PACKED_STAGES if nvfp4 else 0
        smem_bits = SMEM_BARRIER_BYTES * 8
        smem_bits += COL_MAX_BUFFERS * n * 32  # running column max, double-buffered by tile parity
        smem_bits += n * 4 * 32  # per-warp column sums
        smem_bits += n * MMA_K * q_stages * q_bits  # Q
        smem_bits += MMA_M * n * SP_STAGES * q_bits  # P
        smem_bits += 3 * SWIZZLE_ALIGN * 8  # alignment padding of Q, KV, P
        smem_bits += packed_stages * (TILE_KEYS * d * 4 + 128 * 8)
        smem_capacity = min(SMEM_PER_CTA_MAX, SMEM_PER_SM // ctas - SMEM_RESERVED_PER_CTA)
        stage_bits = MMA_M * MMA_K * 8  # KV ring stages hold 1-byte elements (containers for fp6/fp4)
        fit = max(0, (smem_capacity * 8 - smem_bits) // stage_bits)

        if c.ring_stages and c.ring_stages > 0:
            kv_stages = c.ring_stages
        else:
            if c.kv_format in ("e3m2", "e2m3") and ctas == 2 and stages_per_tile == 4:
                target = FP6_RING_2CTA_D256
            else:
                target = stages_per_tile * DEFAULT_RING_TILES[ctas]
            kv_stages = min(fit, target)
            if kv_stages >= stages_per_tile and target % stages_per_tile == 0:
                kv_stages -= kv_stages % stages_per_tile  # smem-limited: keep whole tiles
        return Derived(
            convert_warpgroups=cvt_wgs,
            threads=threads,
            launch_regs=launch_regs,
            reg_reconfig=reg_reconfig,
            softmax_regs=softmax,
            convert_regs=cvt_regs,
            mma_tma_regs=mma_tma,
            q_stages=q_stages,
            stages_per_tile=stages_per_tile,
            kv_stages=kv_stages,
            max_kv_stages_fit=fit,
            cvt_stages=cvt_stages,
            packed_stages=packed_stages,
            tmem_cols_used=tmem_used,
            tmem_cols=tmem_cols,
            tmem_capacity=tmem_capacity,
            smem_fixed_bytes=smem_bits // 8,
            smem_capacity=smem_capacity,
        )


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _field_problems(c) -> list[str]:
    """Each field of a ThorConfig alone (e4m3 Q runs every KV format; combinations are checked after)."""
    problems = []

    def bad(name, allowed):
        problems.append(f"{name}={getattr(c, name)!r} (allowed: {allowed})")

    for name in ("head_dim", "page_size"):
        if getattr(c, name) is None:
            bad(name, "an int")
    alone = (unsupported_reason(c.kv_format, "e4m3", c.head_dim, c.page_size), unsupported_reason("e4m3", c.q_dtype))
    for reason in alone:
        if reason is not None:
            problems.append(reason)
    if not _is_int(c.q_tile) or c.q_tile not in Q_TILES:
        bad("q_tile", f"one of {Q_TILES}")
    if not _is_int(c.q_len) or c.q_len < 1:
        bad("q_len", "an int >= 1")
    if not _is_int(c.ctas_per_sm) or c.ctas_per_sm not in (1, 2):
        bad("ctas_per_sm", "1 or 2")
    if not _is_int(c.ring_stages) or c.ring_stages < 0:
        bad("ring_stages", "an int >= 0 (0 = tuned default)")
    if not _is_int(c.max_splits) or not 1 <= c.max_splits <= MAX_SPLITS_LIMIT:
        bad("max_splits", f"an int in 1..{MAX_SPLITS_LIMIT}")
    if not isinstance(c.causal, bool):
        bad("causal", "True or False")
    if not isinstance(c.pdl, bool):
        bad("pdl", "True or False")
    return problems


def can_implement_thor(c: ThorConfig) -> None:
    """Raise ``ConfigError`` (a ValueError) naming every offending field and value, or return None.

    Runs in pure Python before anything compiles.
    """
    problems = _field_problems(c)
    if problems:
        raise ConfigError("ThorConfig cannot be implemented: " + "; ".join(problems))

    # Combinations (only once every field is individually valid).
    reason = unsupported_reason(c.kv_format, c.q_dtype)

    if reason is not None:
        problems.append(f"kv_format={c.kv_format!r} with q_dtype={c.q_dtype!r} ({reason})")
    if c.q_dtype == "e4m3" and c.q_tile % 16:
        problems.append(f"q_tile={c.q_tile} with q_dtype='e4m3' (the fp8 MMA needs q_tile 16 or 32)")
    dv = c.derived
    if dv.convert_warpgroups > 1 and (c.head_dim // MMA_K) % dv.convert_warpgroups:
        problems.append(f"head_dim={c.head_dim} with {dv.convert_warpgroups} convert warpgroups")
    if not c.fp8 and dv.cvt_stages < 1:
        problems.append(
            f"q_tile={c.q_tile}, head_dim={c.head_dim}, ctas_per_sm={c.ctas_per_sm}: no TMEM left for the bf16"
            f" convert ring ({dv.tmem_cols_used} of {dv.tmem_capacity} columns used)"
        )
    if dv.tmem_cols > dv.tmem_capacity:
        problems.append(
            f"q_tile={c.q_tile}, head_dim={c.head_dim}, ctas_per_sm={c.ctas_per_sm}: needs {dv.tmem_cols} TMEM"
            f" columns, {dv.tmem_capacity} available per CTA"
        )
    if dv.kv_stages < 1 or dv.kv_stages > dv.max_kv_stages_fit:
        what = f"ring_stages={c.ring_stages}" if c.ring_stages else "the default ring"
        problems.append(
            f"{what}: {dv.kv_stages} KV stages of 16 KiB, shared memory fits {dv.max_kv_stages_fit} "
            f"({dv.smem_fixed_bytes} B fixed, {dv.smem_capacity} B per CTA at ctas_per_sm={c.ctas_per_sm})"
        )
    if c.kv_format == "nvfp4" and dv.kv_stages < dv.stages_per_tile // 2:
        problems.append(f"ring_stages={c.ring_stages} with kv_format='nvfp4' (needs >= {dv.stages_per_tile // 2})")
    if dv.reg_reconfig:
        if dv.softmax_regs < max(SOFTMAX_MIN_REGS, dv.launch_regs):
            problems.append(
                f"ctas_per_sm={c.ctas_per_sm}, q_tile={c.q_tile}: softmax warpgroup gets {dv.softmax_regs} registers"
                f" (needs >= {max(SOFTMAX_MIN_REGS, dv.launch_regs)}); use ctas_per_sm=1"
            )
    if problems:
        raise ConfigError("ThorConfig cannot be implemented: " + "; ".join(problems))
