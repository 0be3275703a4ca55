"""Backend selection by compute capability and the Hopper kernel's config rules (no GPU, no cutlass)."""

import pytest

from mjolnir_kernel.arch import backend_of_capability
from mjolnir_kernel.config import SHAPE_FIELDS, ConfigError, default_config
from mjolnir_kernel.hopper.config import RING_STAGES, HopperConfig, can_implement_hopper
from mjolnir_numerics.targets import H200


@pytest.mark.parametrize(
    "cap, backend",
    [((9, 0), "hopper"), ((10, 0), "thor"), ((10, 3), "thor"), ((11, 0), "thor"), ((8, 9), None), ((12, 0), None)],
)
def test_backend_by_compute_capability(cap, backend):
    assert backend_of_capability(*cap) == backend


def test_every_format_and_both_q_paths_are_implementable():
    for fmt in ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"):
        for d in (128, 256):
            for q_tile in (8, 16):
                can_implement_hopper(HopperConfig(head_dim=d, kv_format=fmt, q_dtype="e4m3", q_tile=q_tile))
    can_implement_hopper(HopperConfig(q_dtype="bf16", kv_format="e4m3"))


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"head_dim": 96}, ["head_dim: 96"]),
        ({"page_size": 8}, ["page_size: 8"]),
        ({"q_len": 0}, ["q_len=0"]),
        ({"kv_format": "e2m1", "q_dtype": "bf16"}, ["q_dtype", "e2m1 KV runs only with e4m3 Q"]),
        ({"kv_format": "int4"}, ["kv_format: 'int4'"]),
        ({"max_splits": 0}, ["max_splits=0"]),
        ({"pdl": "yes"}, ["pdl='yes'"]),
        ({"causal": 1}, ["causal=1"]),
        ({"q_tile": 4}, ["q_tile=4", "(8, 16)"]),
        ({"q_tile": 32}, ["q_tile=32"]),
        ({"q_len": 0, "q_tile": 4}, ["q_len=0", "q_tile=4"]),  # every offender is named
    ],
)
def test_invalid_configs_name_every_offending_field(kwargs, names):
    with pytest.raises(ConfigError) as e:
        can_implement_hopper(HopperConfig(**kwargs))
    for name in names:
        assert name in str(e.value)


def test_the_config_has_only_shape_fields_and_pdl():
    """Every field is a problem-shape field (SHAPE_FIELDS), the split bound or the pdl feature: the kernel's
    internal choices are derived properties."""
    from dataclasses import fields

    assert {f.name for f in fields(HopperConfig)} == set(SHAPE_FIELDS) | {"max_splits", "pdl"}


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e3m2", "e2m3", "nvfp4"])
@pytest.mark.parametrize("d", [128, 256])
def test_who_converts_is_derived(fmt, d):
    """fp6 at d = 128 and NVFP4 take four converter warps (one CTA per SM, a 3-stage ring at d = 128, two
    e4m3 tiles each of K and V); e2m1 and fp6 at d = 256 convert K into registers in the eight MMA warps;
    e4m3 converts nothing. Every one of these configs fits."""
    c = HopperConfig(head_dim=d, kv_format=fmt, q_dtype="e4m3")
    can_implement_hopper(c)
    converters = fmt == "nvfp4" or (fmt in ("e3m2", "e2m3") and d == 128)
    assert c.converters == converters and c.converter_warps == (4 if converters else 0)
    assert c.threads == 256 + 32 * c.converter_warps
    assert c.k_registers == (fmt != "e4m3" and not converters)
    if converters:
        assert c.ctas_per_sm == 1 and c.ring_stages == (3 if d == 128 else 2)
        assert not (c.overlap or c.v_late)
    else:
        assert c.ctas_per_sm == H200.ctas(d) and c.ring_stages == RING_STAGES


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e3m2", "e2m3", "nvfp4"])
@pytest.mark.parametrize("d", [128, 256])
def test_the_spec_walk_follows_who_converts_k(fmt, d):
    """The spec's Hopper walk (``arithmetic.kstep_groups``) adds consecutive head dims per k-step exactly
    where the kernel reads K from an e4m3 tile, and lane-ordered ones where K goes to registers."""
    import torch

    from mjolnir_numerics.arithmetic import kstep_groups

    walk, _ = kstep_groups("mma_sync_sm90", fmt, "e4m3", d)
    consecutive = torch.equal(walk, torch.arange(d).view(d // 16, 16))
    assert consecutive == (not HopperConfig(head_dim=d, kv_format=fmt, q_dtype="e4m3").k_registers)


def test_scaled_conversion_and_k_in_registers_are_derived():
    """e2m1, e3m2 and e2m3 are converted by bit placement; NVFP4 keeps its table; e4m3 is read as stored.
    Where K goes to registers, V converts late at d = 256, and e2m1 overlaps P.V with the next tile's S."""
    for fmt in ("e2m1", "e3m2", "e2m3"):
        c = HopperConfig(kv_format=fmt, q_dtype="e4m3", head_dim=256)
        assert c.scaled_kv and c.k_registers and c.v_late
        assert c.overlap == (fmt == "e2m1")
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert e2m1.k_registers and e2m1.overlap and not e2m1.v_late
    nvfp4 = HopperConfig(kv_format="nvfp4", q_dtype="e4m3")
    assert not (nvfp4.scaled_kv or nvfp4.k_registers or nvfp4.overlap or nvfp4.v_late)
    e4m3 = HopperConfig()
    assert not (e4m3.packed or e4m3.scaled_kv or e4m3.k_registers or e4m3.v_late or e4m3.overlap)


def test_resource_plan():
    small = HopperConfig(head_dim=128)
    big = HopperConfig(head_dim=256)
    assert small.ring_stages == RING_STAGES == 2
    assert small.smem_bytes < big.smem_bytes <= H200.smem_per_cta
    assert (small.ctas_per_sm, big.ctas_per_sm) == (H200.ctas(128), H200.ctas(256)) == (2, 1)
    # packed formats: a packed ring plus the converted tiles; NVFP4 adds the block-scale rows
    fp4 = HopperConfig(head_dim=256, kv_format="e2m1", q_dtype="e4m3")
    nvfp4 = HopperConfig(head_dim=256, kv_format="nvfp4", q_dtype="e4m3")
    assert fp4.packed and not big.packed and fp4.packed_row_bytes == 128 and nvfp4.packed_row_bytes == 128
    p_and_stats = 16 * (128 + 8) * 2 + 2 * 8 * 16 * 4 + 512
    # NVFP4 (converter warps): a 2-stage ring, two e4m3 tiles each of K and V, the block-scale rows of each stage
    assert nvfp4.smem_bytes == 2 * 2 * 128 * 128 + 4 * 128 * 256 + 2 * 2 * 128 * 16 + p_and_stats
    # ring (2 stages x K and V, 64 packed bytes per key) + two e4m3 V tiles, P, the row statistics, 512 spare
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert e2m1.smem_bytes == 2 * 2 * 128 * 64 + 2 * 128 * 128 + p_and_stats
    for cfg in (small, big, fp4, nvfp4, e2m1):
        assert cfg.ctas_per_sm <= cfg.smem_ctas_limit  # shared memory agrees with the target's occupancy


def test_short_names():
    small = HopperConfig(head_dim=128)
    assert small.short_name() == "sm90-bf16-e4m3-d128-t16-ps128-q1c-s16"
    assert HopperConfig(q_len=4, causal=False).short_name() != HopperConfig(q_len=4).short_name()
    assert HopperConfig(pdl=True).short_name() == small.short_name() + "-pdl"
    assert "-t8-" in HopperConfig(q_tile=8).short_name()


def test_p_scale_follows_the_q_path():
    assert HopperConfig(q_dtype="e4m3").p_scale == 448.0
    assert HopperConfig(q_dtype="bf16").p_scale == 1.0


@pytest.mark.parametrize("n_q, tile", [(1, 8), (4, 8), (8, 8), (9, 16), (16, 16), (24, 16), (40, 16)])
def test_default_config_takes_eight_rows_when_a_kv_head_has_at_most_eight(n_q, tile):
    cfg = default_config("h200", head_dim=128, page_size=64, q_len=1, kv_format="e4m3", q_dtype="bf16", n_q=n_q)
    assert isinstance(cfg, HopperConfig) and cfg.q_tile == tile
    assert cfg.max_splits == H200.max_splits


def test_default_config_refuses_what_the_kernels_cannot_run():
    with pytest.raises(ValueError, match="e4m3 Q"):
        default_config("h200", head_dim=128, page_size=64, q_len=1, kv_format="e2m1", q_dtype="bf16", n_q=4)
    with pytest.raises(ValueError, match="head_dim: 64"):
        default_config("h200", head_dim=64, page_size=64, q_len=1, kv_format="e4m3", q_dtype="bf16", n_q=4)
