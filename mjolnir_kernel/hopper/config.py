"""Compile key of the Hopper (sm_90a) decode kernel, its resource plan and ``can_implement``.

No cutlass import: configs are validated before anything compiles (CI, ``decode()``).

The Hopper kernel computes what the Thor kernel computes (the spec's stages,
``mjolnir_numerics.emulator_stages``) with warp-level ``mma.sync`` instead of tcgen05. Every KV value
enters the MMA as an exact 16-bit value (f16 on the e4m3-Q path: e4m3 Q, K, V and P = e4m3(p * 448) are
all f16 values; bf16 on the bf16-Q path; e2m1, e3m2 and e2m3 K and V enter as value * 2^-k and Q and P as
value * 2^k, so every product is the same), and each 128-key tile's products are added to fp32
accumulators, so no contraction is longer than one tile (Hopper's fp8 tensor cores add long
contractions with reduced precision: docs/numerics.md, "Special functions and the tensor cores").

The config holds the problem's shape and two features; every other choice of the kernel is derived
from them (the properties below), each the one measured fastest on the H200. The alternatives that
measured no faster were removed (``reports/hopper/``; the code is at git tag ``hopper-experiments``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mjolnir_numerics.capability import HEAD_DIMS, unsupported_reason
from mjolnir_numerics.capability import KV_FORMATS as CAPABILITY_KV_FORMATS
from mjolnir_numerics.emulator import KERNEL_P_SCALE
from mjolnir_numerics.formats import FORMATS
from mjolnir_numerics.plan import TILE_KEYS
from mjolnir_numerics.targets import H200

from ..errors import ConfigError

SMEM_PER_SM = H200.smem_per_sm
SMEM_RESERVED_PER_CTA = H200.smem_reserved_per_cta

# ---------------------------------------------------------------------------------------------
# Tuning block
# ---------------------------------------------------------------------------------------------
THREADS = 256  # eight warps: S by keys (16 per warp), P.V by head-dim slices (d / 8 per warp)
WARPS = THREADS // 32
Q_TILE = 16  # rows of the mma.m16n8k16 tile (n_q > 16 tiles over gridDim.y)
P_ROW_PAD = 8  # 16-bit elements of padding per P row in smem (ldmatrix rows on distinct banks)
# KV tiles in the cp.async ring: 2 beat 3 on the H200 at d = 128 (more CTAs per SM) and tie at d = 256;
# deeper rings measured 0.81-1.01x of 2 for the sub-byte formats (reports/hopper/)
RING_STAGES = 2
MAX_SPLITS_LIMIT = 64
# Converter warps (fp6 at d = 128, NVFP4): four more warps per CTA load and convert the packed tiles into e4m3
# tiles (two of K and V each) while the eight warps above run the e4m3 path's MMAs. Eight measured no faster
# than four (0.99-1.02x on an H100; reports/hopper/2026-12-07-converter-warps-gpu.md)
CONVERTER_WARPS = 4
# ---------------------------------------------------------------------------------------------

KV_FORMATS = CAPABILITY_KV_FORMATS
SCALED_KV_FORMATS = ("e2m1", "e3m2", "e2m3")  # the formats whose values times 2^-k are their bits, placed
Q_TILES = tuple(t for t in H200.q_tiles)


@dataclass(frozen=True)
class HopperConfig:
    """Compile key of the Hopper decode kernel.

    Fields (the problem's shape, then features):
      head_dim    d: 128 or 256
      page_size   keys per page: 16, 32, 64 or 128 (paging is runtime addressing; the size shapes masks)
      q_len       query tokens per sequence (>= 1)
      kv_format   KV cache format (``mjolnir_numerics.capability.KV_FORMATS``)
      q_dtype     "bf16" (bf16 MMA, P = bf16(p)) or "e4m3" (f16 MMA on e4m3 values, P = e4m3(p * 448))
      causal      q_len > 1: query qi sees keys 0 .. L - q_len + qi (False: all L keys)
      q_tile      query rows per CTA, ``mjolnir_numerics.targets.H200.q_tile(n_q, q_dtype)``: 16, or 8 when
                  a KV head has n_q = q_len * h_r <= 8 query rows (GQA decode at h_q / h_k <= 8): rows 8-15
                  of the 16-row MMA tile are then padding, and the softmax, row sums and O rescale skip them
                  (1.00-1.09x faster on the H200, ``bench_hopper_decode --q-rows 16,auto``, fourth session)
      max_splits  partial slots per sequence; 1 compiles the reduction out (every sequence unsplit)
      pdl         programmatic dependent launch: the decode grid waits for the previous grid
                  (griddepcontrol), and the reduction grid launches while the decode grid runs and waits
                  for it. A feature for callers that chain kernels; it measured no faster in the benchmark's
                  back-to-back decode calls (reports/hopper/)

    Derived (each the variant measured fastest on the H200 or the H100; reports/hopper/ has the runs):
      ``converters``, ``scaled_kv``, ``k_registers``, ``v_late``, ``overlap``, ``ctas_per_sm``, ``ring_stages``.
    """

    head_dim: int = 128
    page_size: int = 128
    q_len: int = 1
    kv_format: str = "e4m3"
    q_dtype: str = "bf16"
    causal: bool = True
    q_tile: int = Q_TILE
    max_splits: int = 16
    pdl: bool = False

    def key(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def short_name(self) -> str:
        """``sm90-bf16-e4m3-d128-t16-ps128-q1c-s16``."""
        causal = "c" if self.causal else "n"
        return (
            f"sm90-{self.q_dtype}-{self.kv_format}-d{self.head_dim}-t{self.q_tile}-ps{self.page_size}"
            f"-q{self.q_len}{causal}-s{self.max_splits}" + ("-pdl" if self.pdl else "")
        )

    # -- derived ------------------------------------------------------------------------------
    @property
    def fp8(self) -> bool:
        return self.q_dtype == "e4m3"

    @property
    def p_scale(self) -> float:
        return KERNEL_P_SCALE if self.fp8 else 1.0

    @property
    def ring_stages(self) -> int:
        """KV tiles (one K and one V tile each) in the shared-memory ring. With converter warps: 3 at d = 128
        and 2 at d = 256, what shared memory holds beside the four e4m3 tiles at one CTA per SM (not timed
        against other depths)."""
        if self.converters:
            return 3 if self.head_dim == 128 else 2
        return RING_STAGES

    @property
    def converters(self) -> bool:
        """fp6 at d = 128 and NVFP4: ``CONVERTER_WARPS`` more warps load the packed tiles and convert K and V
        into e4m3 tiles (two of each in shared memory), which the eight MMA warps read as e4m3 KV's; one CTA
        per SM. Against the eight warps converting between their MMAs (K into registers), on an H100 with
        ``bench_hopper_decode --back-to-back 20`` at L = 32K, batch 1 to 32: fp6 0.875-0.93x the time and
        NVFP4 0.90-0.97x in one run with a plan for one CTA per SM; with the default plan, against main in the
        next, fp6 0.905-0.912x and NVFP4 0.925-0.965x (batch 8 and 32). e2m1 measured 0.93-1.035x and keeps
        the eight warps; fp6 at d = 256 does not fit shared memory.
        S then adds consecutive head dims (``arithmetic.kstep_groups``)."""
        return self.kv_format == "nvfp4" or (self.kv_format in ("e3m2", "e2m3") and self.head_dim == 128)

    @property
    def converter_warps(self) -> int:
        """Warps that load and convert the tiles (``converters``), after the eight MMA warps; 0 without."""
        return CONVERTER_WARPS if self.converters else 0

    @property
    def threads(self) -> int:
        """Threads of one CTA: the eight MMA warps, and the converter warps."""
        return THREADS + 32 * self.converter_warps

    @property
    def packed(self) -> bool:
        """True for sub-byte formats: the ring holds packed codes, converted to e4m3 per tile."""
        return self.kv_format != "e4m3"

    @property
    def scaled_kv(self) -> bool:
        """e2m1, e3m2 and e2m3 codes become e4m3 bytes of value * 2^-k by bit placement, and Q and P are
        multiplied by 2^k: the same products as exact conversion, with fewer instructions (1.03-1.41x
        faster on the H200)."""
        return self.kv_format in SCALED_KV_FORMATS

    @property
    def k_registers(self) -> bool:
        """Without converter warps (e2m1, fp6 at d = 256), packed K goes from the ring stage straight into
        each warp's MMA fragments instead of through an e4m3 tile in shared memory (e2m1 1.03-1.07x, e3m2
        0.99-1.10x, e2m3 1.00-1.06x faster on the H200)."""
        return self.packed and not self.converters

    @property
    def v_late(self) -> bool:
        """With K in registers (e2m1, fp6 at d = 256), V's tile is converted after the QK MMAs are issued
        (their latency hidden) at d = 256 (1.00-1.06x), before K's codes at d = 128 (e2m1; late measured
        0.97-1.00x there for the formats that then took it)."""
        return self.k_registers and self.head_dim == 256

    @property
    def overlap(self) -> bool:
        """P.V of a tile and S of the next run between the same barriers: for e2m1 (1.01-1.04x back to
        back); fp6 (then at both head dims) measured 0.95-1.07x and stays serial at d = 256."""
        return self.k_registers and self.kv_format == "e2m1"

    @property
    def tile_bytes(self) -> int:
        """Bytes of one 128-key tile of K (or V) as the MMA reads it (one e4m3 byte per element)."""
        return TILE_KEYS * self.head_dim

    @property
    def ring_row_bytes(self) -> int:
        """Bytes from one key row of a ring stage to the next: packed rows for sub-byte formats, d e4m3
        bytes (swizzled) otherwise."""
        return self.packed_row_bytes if self.packed else self.head_dim

    @property
    def packed_row_bytes(self) -> int:
        """Bytes of one key row as stored (d * bits / 8)."""
        return self.head_dim * FORMATS[self.kv_format].bits // 8

    @property
    def smem_bytes(self) -> int:
        p = Q_TILE * (TILE_KEYS + P_ROW_PAD) * 2
        stats = 2 * WARPS * Q_TILE * 4
        ring = 2 * self.ring_stages * TILE_KEYS * self.ring_row_bytes
        if self.packed:  # the converted tiles: two K and two V (converters), else V's (two with overlap)
            tiles = 4 if self.converters else 1 + self.overlap
            ring += tiles * self.tile_bytes
            if self.kv_format == "nvfp4":  # block-scale rows of each stage
                ring += 2 * self.ring_stages * TILE_KEYS * (self.head_dim // 16)
        return ring + p + stats + 512

    @property
    def ctas_per_sm(self) -> int:
        """Co-resident CTAs (the launch's min_blocks_per_mp): the H200 target's (``mjolnir_numerics.targets``:
        2 at d = 128, 1 at d = 256, the default plan's occupancy); ``can_implement_hopper`` checks that shared
        memory holds them. With converter warps: 1 (384 threads, 168 registers each), while the default plan
        keeps the target's occupancy (a plan is valid for any residency; the kernel and ``emulate_decode``
        make the same one)."""
        if self.converters:
            return 1
        return H200.ctas(self.head_dim) if self.head_dim in HEAD_DIMS else 1

    @property
    def smem_ctas_limit(self) -> int:
        """CTAs of this config that shared memory can hold on one SM."""
        return SMEM_PER_SM // (self.smem_bytes + SMEM_RESERVED_PER_CTA)


def can_implement_hopper(c: HopperConfig) -> None:
    """Raise ConfigError naming every field the Hopper kernel cannot implement."""
    if not isinstance(c, HopperConfig):
        raise ConfigError(f"config: expected a HopperConfig, got {type(c).__name__}")
    problems = [f"{name}=None (an int)" for name in ("head_dim", "page_size") if getattr(c, name) is None]
    reason = unsupported_reason(c.kv_format, c.q_dtype, c.head_dim, c.page_size)
    if reason is not None:
        problems.append(reason)
    if isinstance(c.q_len, bool) or not isinstance(c.q_len, int) or c.q_len < 1:
        problems.append(f"q_len={c.q_len!r} (an int >= 1)")
    if isinstance(c.q_tile, bool) or not isinstance(c.q_tile, int) or c.q_tile not in Q_TILES:
        problems.append(f"q_tile={c.q_tile!r} (allowed {Q_TILES})")
    if isinstance(c.max_splits, bool) or not isinstance(c.max_splits, int) or not 1 <= c.max_splits <= MAX_SPLITS_LIMIT:
        problems.append(f"max_splits={c.max_splits!r} (1 .. {MAX_SPLITS_LIMIT})")
    for name in ("causal", "pdl"):
        if not isinstance(getattr(c, name), bool):
            problems.append(f"{name}={getattr(c, name)!r} (True or False)")
    if not problems and c.ctas_per_sm > c.smem_ctas_limit:
        problems.append(
            f"head_dim={c.head_dim}, kv_format={c.kv_format!r}: {c.ctas_per_sm} CTAs x {c.smem_bytes} B of shared"
            " memory do not fit one SM"
        )
    if problems:
        raise ConfigError("HopperConfig cannot be implemented: " + "; ".join(problems))
