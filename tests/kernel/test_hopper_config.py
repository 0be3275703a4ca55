"""Backend selection by compute capability and the Hopper kernel's config rules (no GPU, no cutlass)."""

from dataclasses import replace

import pytest

from mjolnir_kernel.arch import backend_of_capability
from mjolnir_kernel.config import ConfigError
from mjolnir_kernel.hopper.config import (
    DEFAULT_STAGES,
    MAX_CTAS_PER_SM,
    SMEM_PER_CTA_MAX,
    HopperConfig,
    can_implement_hopper,
)


@pytest.mark.parametrize(
    "cap, backend",
    [((9, 0), "hopper"), ((10, 0), "thor"), ((10, 3), "thor"), ((11, 0), "thor"), ((8, 9), None), ((12, 0), None)],
)
def test_backend_by_compute_capability(cap, backend):
    assert backend_of_capability(*cap) == backend


def test_every_format_and_both_q_paths_are_implementable():
    for fmt in ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"):
        for d in (128, 256):
            can_implement_hopper(HopperConfig(head_dim=d, kv_format=fmt, q_dtype="e4m3"))
    can_implement_hopper(HopperConfig(q_dtype="bf16", kv_format="e4m3"))


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"head_dim": 96}, ["head_dim=96"]),
        ({"page_size": 8}, ["page_size=8"]),
        ({"q_len": 0}, ["q_len=0"]),
        ({"kv_format": "e2m1", "q_dtype": "bf16"}, ["q_dtype='bf16'", "needs e4m3 Q"]),
        ({"kv_format": "int4"}, ["kv_format='int4'"]),
        ({"max_splits": 0}, ["max_splits=0"]),
        ({"stages": 1}, ["stages=1"]),
        ({"pdl": "yes"}, ["pdl='yes'"]),
        ({"mma": "hmma"}, ["mma='hmma'"]),
        ({"q_rows": 4}, ["q_rows=4"]),
        ({"ctas": 5}, ["ctas=5"]),
        ({"ctas": 3, "head_dim": 256, "stages": 3}, ["ctas=3", "do not fit one SM"]),
        ({"q_rows": 8, "mma": "wgmma", "q_dtype": "e4m3"}, ["q_rows=8 with mma='wgmma'"]),
        ({"mma": "wgmma", "q_dtype": "bf16"}, ["mma='wgmma'", "needs e4m3 Q"]),
        ({"stages": 9, "head_dim": 256}, ["stages=9", "shared memory"]),
        ({"head_dim": 96, "page_size": 8}, ["head_dim=96", "page_size=8"]),
        ({"loads": "dma"}, ["loads='dma'"]),
        ({"loads": "tma", "kv_format": "e2m3", "q_dtype": "e4m3"}, ["loads='tma'", "needs e4m3 KV"]),
        ({"loads": "bulk", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["loads='bulk'", "needs e4m3 KV"]),
        ({"loads": "bulk", "mma": "wgmma", "q_dtype": "e4m3"}, ["loads='bulk'", "mma='sync'"]),
        ({"prefetch": 32}, ["prefetch=32"]),
        ({"prefetch": 256, "loads": "bulk"}, ["prefetch=256 with loads='bulk'"]),
        ({"merge": "grid"}, ["merge='grid'", "'kernel', 'fused'"]),
        ({"evict_first": 1}, ["evict_first=1"]),
        ({"v_operand": "tmem", "mma": "wgmma", "q_dtype": "e4m3"}, ["v_operand='tmem'", "'registers', 'smem', 'f16'"]),
        ({"v_operand": "f16"}, ["v_operand='f16' with mma='sync'", "needs mma='wgmma'"]),
        ({"kv_convert": "lut", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["kv_convert='lut'", "'exact', 'scaled'"]),
        ({"kv_convert": "scaled", "kv_format": "nvfp4", "q_dtype": "e4m3"}, ["kv_convert='scaled'", "'nvfp4'"]),
        ({"kv_convert": "scaled"}, ["kv_convert='scaled' with kv_format='e4m3'"]),
        ({"kv_convert": "scaled", "kv_format": "e3m2", "q_dtype": "e4m3", "mma": "wgmma"}, ["mma='wgmma'"]),
        ({"k_operand": "smem", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["k_operand='smem'", "'tile', 'registers'"]),
        ({"k_operand": "registers"}, ["k_operand='registers' with kv_format='e4m3'", "sub-byte"]),
        ({"k_operand": "registers", "kv_format": "e2m1", "q_dtype": "e4m3", "mma": "wgmma"}, ["mma='wgmma'"]),
        ({"v_convert": "soon", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["v_convert='soon'", "'early', 'late'"]),
        ({"v_convert": "late", "kv_format": "nvfp4", "q_dtype": "e4m3"}, ["v_convert='late'", "K in registers"]),
        ({"v_convert": "early", "kv_format": "e2m1", "q_dtype": "e4m3", "k_operand": "tile"}, ["k_operand='tile'"]),
        ({"schedule": "pipelined", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["schedule='pipelined'", "'overlap'"]),
        ({"schedule": "overlap", "kv_format": "nvfp4", "q_dtype": "e4m3"}, ["schedule='overlap'", "K in registers"]),
        ({"schedule": "overlap"}, ["schedule='overlap' with k_operand='auto'"]),
        ({"mma_layout": "cols", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["mma_layout='cols'", "'rows', 'keys'"]),
        ({"mma_layout": "keys", "kv_format": "e2m1", "q_dtype": "e4m3"}, ["mma_layout='keys'", "q_rows=16"]),
        ({"mma_layout": "keys", "q_rows": 8}, ["mma_layout='keys' with kv_format='e4m3'", "K in registers"]),
    ],
)
def test_invalid_configs_name_every_offending_field(kwargs, names):
    with pytest.raises(ConfigError) as e:
        can_implement_hopper(HopperConfig(**kwargs))
    for name in names:
        assert name in str(e.value)


def test_v_operand_names_and_shared_memory():
    base = HopperConfig(head_dim=128, q_dtype="e4m3", mma="wgmma")
    by_v = {v: replace(base, v_operand=v) for v in ("registers", "smem", "f16")}
    assert [c.short_name().split("-r2")[1] for c in by_v.values()] == ["-wg", "-wg-vs", "-wg-vf16"]
    # V^T tile: d x 128 e4m3 bytes for "smem"; f16 V^T (twice that) and f16 P (one more 16 x 128 bytes)
    assert by_v["smem"].smem_bytes - by_v["registers"].smem_bytes == 128 * 128
    assert by_v["f16"].smem_bytes - by_v["registers"].smem_bytes == 2 * 128 * 128 + 16 * 128
    for c in by_v.values():
        can_implement_hopper(c)
    assert by_v["f16"].ctas_per_sm == 2 and replace(by_v["f16"], head_dim=256).ctas_per_sm == 1


def test_kv_convert_applies_to_the_formats_whose_bits_place():
    """kv_convert="auto" scales e2m1, e3m2 and e2m3 on the mma.sync path (their values times 2^-k are their bits);
    "exact" keeps the exact widening there; NVFP4, e4m3 and the wgmma path never scale. Only the explicit
    choices show in the name, and the choice alone (K's path pinned) does not change shared memory."""
    for fmt in ("e2m1", "e3m2", "e2m3"):
        auto = HopperConfig(kv_format=fmt, q_dtype="e4m3")
        assert auto.scaled_kv and replace(auto, kv_convert="scaled").scaled_kv
        assert not replace(auto, kv_convert="exact").scaled_kv
        assert not replace(auto, mma="wgmma").scaled_kv
        assert replace(auto, kv_convert="exact").short_name() == auto.short_name() + "-kx"
        assert replace(auto, kv_convert="scaled").short_name() == auto.short_name() + "-ks"
        assert replace(auto, kv_convert="exact", k_operand="registers").smem_bytes == auto.smem_bytes
    assert not HopperConfig(kv_format="nvfp4", q_dtype="e4m3").scaled_kv
    assert not HopperConfig().scaled_kv


def test_k_operand_auto_takes_the_registers_path_for_the_scaled_formats():
    """k_operand="auto" converts K straight into the MMA fragments for e2m1, e3m2 and e2m3 (scaled) and keeps
    the K tile for NVFP4 and the exact conversion; the registers path holds one converted tile (V) instead
    of two, and d = 256 stays at one CTA per SM even where shared memory would hold two (registers)."""
    for fmt in ("e2m1", "e3m2", "e2m3"):
        auto = HopperConfig(kv_format=fmt, q_dtype="e4m3")
        tile = replace(auto, k_operand="tile")
        assert auto.k_registers and replace(auto, k_operand="registers").k_registers and not tile.k_registers
        assert not replace(auto, kv_convert="exact").k_registers
        assert replace(auto, kv_convert="exact", k_operand="registers").k_registers
        serial = replace(auto, schedule="serial")  # (e2m1's "auto" overlaps, with a second V tile)
        assert tile.smem_bytes - serial.smem_bytes == auto.tile_bytes == 128 * 128
        assert tile.short_name() == auto.short_name() + "-kt"
        assert replace(auto, k_operand="registers").short_name() == auto.short_name() + "-kr"
        assert replace(auto, head_dim=256).ctas_per_sm == 1
    e2m1_d256 = HopperConfig(head_dim=256, kv_format="e2m1", q_dtype="e4m3", schedule="serial")
    assert e2m1_d256.smem_ctas_limit >= 2 and e2m1_d256.ctas_per_sm == 1
    assert replace(e2m1_d256, ctas=2).ctas_per_sm == 2  # an explicit choice stands
    nvfp4 = HopperConfig(kv_format="nvfp4", q_dtype="e4m3")
    assert not nvfp4.k_registers and replace(nvfp4, k_operand="registers").k_registers
    # V's tile: after the QK MMAs at d = 256, before K's codes at d = 128 (auto); only with K in registers
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert not e2m1.v_late and replace(e2m1, head_dim=256).v_late
    assert replace(e2m1, v_convert="late").v_late and not replace(e2m1, head_dim=256, v_convert="early").v_late
    assert not replace(e2m1, head_dim=256, k_operand="tile").v_late and not replace(nvfp4, k_operand="tile").v_late
    # NVFP4 at d = 256: K in registers and V late ("auto")
    assert replace(nvfp4, head_dim=256).k_registers and replace(nvfp4, head_dim=256).v_late
    assert not replace(nvfp4, head_dim=256, k_operand="tile").k_registers
    assert replace(e2m1, v_convert="late").short_name() == e2m1.short_name() + "-vl"
    assert replace(e2m1, v_convert="early").short_name() == e2m1.short_name() + "-ve"
    assert (
        not HopperConfig().k_registers and not HopperConfig(kv_format="e2m1", q_dtype="e4m3", mma="wgmma").k_registers
    )
    from mjolnir_kernel.api import select_hopper_config

    kw = dict(head_dim=128, page_size=64, q_len=1, kv_format="e2m1", q_dtype="e4m3")
    assert select_hopper_config(**kw).k_operand == "auto"
    assert select_hopper_config(**kw, k_operand="tile").k_operand == "tile"
    with pytest.raises(ConfigError, match="k_operand='registers' with kv_format='e4m3'"):
        select_hopper_config(**{**kw, "kv_format": "e4m3"}, k_operand="registers")


def test_resource_plan():
    small = HopperConfig(head_dim=128)
    big = HopperConfig(head_dim=256)
    assert small.ring_stages == DEFAULT_STAGES
    assert small.smem_bytes < big.smem_bytes <= SMEM_PER_CTA_MAX
    assert 1 <= big.ctas_per_sm <= small.ctas_per_sm <= MAX_CTAS_PER_SM
    # packed formats hold a packed ring plus one converted tile; NVFP4 adds the block-scale rows
    fp4 = HopperConfig(head_dim=256, kv_format="e2m1", q_dtype="e4m3", k_operand="tile")
    nvfp4 = HopperConfig(head_dim=256, kv_format="nvfp4", q_dtype="e4m3", k_operand="tile")
    assert fp4.packed and not big.packed and fp4.packed_row_bytes == 128
    assert nvfp4.smem_bytes - fp4.smem_bytes == 2 * nvfp4.ring_stages * 128 * (256 // 16)
    assert small.short_name() == "sm90-bf16-e4m3-d128-ps128-q1c-s16-r2"
    assert HopperConfig(q_len=4, causal=False).short_name() != HopperConfig(q_len=4).short_name()
    assert HopperConfig(pdl=True).short_name() == small.short_name() + "-pdl"


def test_p_scale_follows_the_q_path():
    assert HopperConfig(q_dtype="e4m3").p_scale == 448.0
    assert HopperConfig(q_dtype="bf16").p_scale == 1.0


def test_decode_picks_eight_rows_when_the_problem_has_at_most_eight():
    from mjolnir_kernel.api import select_hopper_config

    kw = dict(head_dim=128, page_size=64, q_len=1, kv_format="e4m3", q_dtype="bf16")
    assert select_hopper_config(**kw, n_q=4).q_rows == 8
    assert select_hopper_config(**kw, n_q=8).q_rows == 8
    assert select_hopper_config(**kw, n_q=9).q_rows == 16
    assert select_hopper_config(**kw).q_rows == 16  # n_q unknown: all 16 rows
    assert select_hopper_config(**{**kw, "q_dtype": "e4m3"}, n_q=4, mma="wgmma").q_rows == 16
    assert "-h8" in select_hopper_config(**kw, n_q=4).short_name()
    assert select_hopper_config(**kw, n_q=4, q_rows=16).q_rows == 16  # an explicit choice wins
    assert select_hopper_config(**kw).ctas_per_sm == 2 and select_hopper_config(**kw, ctas_per_sm=3).ctas_per_sm == 3
    with pytest.raises(ValueError, match="q_rows: 8 covers at most 8"):
        select_hopper_config(**kw, n_q=12, q_rows=8)


def test_load_paths_and_l2_hints():
    from mjolnir_kernel.api import select_hopper_config
    from mjolnir_kernel.hopper.config import BULK_ROW_PAD

    base = HopperConfig(head_dim=128, kv_format="e4m3")
    bulk = HopperConfig(head_dim=128, kv_format="e4m3", loads="bulk")
    # bulk rows are padded (no swizzle) and each stage has an 8-byte mbarrier
    assert bulk.ring_row_bytes == 128 + BULK_ROW_PAD and base.ring_row_bytes == 128
    assert bulk.smem_bytes - base.smem_bytes == 2 * base.ring_stages * 128 * BULK_ROW_PAD + 8 * base.ring_stages
    assert HopperConfig(kv_format="e2m1", q_dtype="e4m3").ring_row_bytes == 64  # packed rows as stored
    assert bulk.short_name().endswith("-bulk")
    tma = HopperConfig(head_dim=256, kv_format="e4m3", loads="tma")
    # TMA boxes land swizzled in unpadded rows; the rings are 1024-byte aligned, a barrier per stage
    assert tma.ring_row_bytes == 256 and tma.mbarrier_ring and not base.mbarrier_ring
    wide = HopperConfig(head_dim=256, kv_format="e4m3")
    assert tma.smem_bytes - wide.smem_bytes == 8 * wide.ring_stages + 2 * 1024
    assert tma.short_name().endswith("-tma")
    assert HopperConfig(prefetch=128, evict_first=False).short_name().endswith("-pf128-noef")
    assert HopperConfig().evict_first  # KV lines are marked evict-first unless asked otherwise

    kw = dict(head_dim=128, page_size=64, q_len=1, kv_format="e4m3", q_dtype="bf16")
    assert select_hopper_config(**kw).evict_first is True
    assert select_hopper_config(**kw, evict_first=False).evict_first is False
    chosen = select_hopper_config(**kw, loads="bulk")
    assert chosen.loads == "bulk" and chosen.evict_first  # the policy rides on the bulk copies too
    assert select_hopper_config(**kw, loads="tma").loads == "tma"
    assert select_hopper_config(**kw, prefetch=256).prefetch == 256
    with pytest.raises(ConfigError, match="prefetch=256 with loads='bulk'"):
        select_hopper_config(**kw, loads="bulk", prefetch=256)


def test_split_merge_choice():
    """Split sequences merge in a reduction grid by default; "fused" merges them inside the decode grid,
    and one chunk per sequence (max_splits 1) has nothing to merge."""
    from mjolnir_kernel.api import select_hopper_config

    assert HopperConfig().merge == "kernel" and not HopperConfig(max_splits=16).fused_merge
    assert HopperConfig(max_splits=16, merge="fused").fused_merge
    assert not HopperConfig(max_splits=1, merge="fused").fused_merge
    assert HopperConfig(merge="fused").short_name().endswith("-fm") and "-fm" not in HopperConfig().short_name()
    kw = dict(head_dim=128, page_size=64, q_len=1, kv_format="e4m3", q_dtype="bf16")
    assert select_hopper_config(**kw).merge == "kernel"
    assert select_hopper_config(**kw, merge="fused").merge == "fused"
    with pytest.raises(ConfigError, match="merge='grid'"):
        select_hopper_config(**kw, merge="grid")


def test_schedule_auto_overlaps_e2m1_with_k_in_registers():
    """schedule="auto" overlaps P.V with the next tile's S for e2m1 (K in registers) and runs fp6 serially;
    "overlap" holds a second e4m3 V tile (and no K tile: K is in registers); the names mark explicit choices;
    without K in registers nothing overlaps."""
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert e2m1.overlap and replace(e2m1, head_dim=256).overlap and not replace(e2m1, schedule="serial").overlap
    for fmt in ("e3m2", "e2m3"):
        fp6 = HopperConfig(kv_format=fmt, q_dtype="e4m3")
        assert not fp6.overlap and replace(fp6, schedule="overlap").overlap
        assert replace(fp6, schedule="overlap").smem_bytes - fp6.smem_bytes == fp6.tile_bytes
    assert not replace(e2m1, k_operand="tile").overlap and not HopperConfig(kv_format="nvfp4", q_dtype="e4m3").overlap
    assert replace(HopperConfig(kv_format="nvfp4", q_dtype="e4m3"), k_operand="registers", schedule="overlap").overlap
    assert replace(e2m1, schedule="serial").short_name() == e2m1.short_name() + "-ts"
    assert replace(e2m1, schedule="overlap").short_name() == e2m1.short_name() + "-to"
    # ring (2 stages x K and V, 64 packed bytes per key) + two e4m3 V tiles, P, the row statistics, 512 spare
    assert e2m1.smem_bytes == 2 * 2 * 128 * 64 + 2 * 128 * 128 + 16 * (128 + 8) * 2 + 2 * 8 * 16 * 4 + 512


def test_mma_layout_keys_needs_eight_rows_and_k_in_registers():
    """mma_layout="keys" applies with K in registers, e4m3 Q and an 8-row query tile; "auto" keeps
    the query rows on M; the names mark explicit choices."""
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3", q_rows=8)
    assert not e2m1.keys_on_m and replace(e2m1, mma_layout="keys").keys_on_m
    assert replace(e2m1, mma_layout="keys", schedule="overlap", head_dim=256).keys_on_m
    nvfp4 = HopperConfig(kv_format="nvfp4", q_dtype="e4m3", q_rows=8, mma_layout="keys", k_operand="registers")
    assert nvfp4.keys_on_m
    assert replace(e2m1, mma_layout="keys").short_name() == e2m1.short_name() + "-mk"
    assert replace(e2m1, mma_layout="rows").short_name() == e2m1.short_name() + "-mr"
    from mjolnir_kernel.api import select_hopper_config

    kw = dict(head_dim=128, page_size=64, q_len=1, kv_format="e2m1", q_dtype="e4m3")
    assert select_hopper_config(**kw, n_q=4, mma_layout="keys").keys_on_m
    with pytest.raises(ConfigError, match="mma_layout='keys'"):
        select_hopper_config(**kw, n_q=12, mma_layout="keys")
