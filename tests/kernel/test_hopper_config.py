"""Backend selection by compute capability and the Hopper kernel's config rules (no GPU, no cutlass)."""

from dataclasses import replace

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
    """Every field is a problem-shape field (SHAPE_FIELDS), the split bound, the pdl feature or the converter
    warps (an experiment): the kernel's internal choices are derived properties."""
    from dataclasses import fields

    assert {f.name for f in fields(HopperConfig)} == set(SHAPE_FIELDS) | {"max_splits", "pdl", "converter_warps"}


def test_converter_warps_config():
    """EXPERIMENT: converter warps (4 or 8) join the CTA's eight, K comes from an e4m3 tile (no registers
    path, no overlap), one CTA runs per SM, and only the sub-byte formats take them; fp6 at d = 256 does not
    fit shared memory, and eight converter warps run at d = 128 only (registers)."""
    for fmt in ("e2m1", "e3m2", "e2m3", "nvfp4"):
        for d in (128, 256):
            for warps in (4, 8):
                c = HopperConfig(head_dim=d, kv_format=fmt, q_dtype="e4m3", converter_warps=warps)
                assert c.converters and c.threads == 256 + 32 * warps and c.ctas_per_sm == 1
                assert c.ring_stages == (3 if d == 128 else 2) and not (c.k_registers or c.overlap or c.v_late)
                assert c.short_name() == replace(c, converter_warps=0).short_name() + f"-cw{warps}"
                if warps == 8 and d == 256:
                    with pytest.raises(ConfigError, match="converter_warps=8 with head_dim=256"):
                        can_implement_hopper(c)
                elif fmt in ("e3m2", "e2m3") and d == 256:
                    with pytest.raises(ConfigError, match="do not fit one SM"):
                        can_implement_hopper(c)
                else:
                    can_implement_hopper(c)
                    assert c.smem_bytes > replace(c, converter_warps=0).smem_bytes
    default = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert default.threads == 256 and not default.converters
    with pytest.raises(ConfigError, match="converter_warps=4 with kv_format='e4m3'"):
        can_implement_hopper(HopperConfig(q_dtype="e4m3", converter_warps=4))
    for bad in (2, True, "4", 4.0):
        with pytest.raises(ConfigError, match=f"converter_warps={bad!r}"):
            can_implement_hopper(HopperConfig(kv_format="e2m1", q_dtype="e4m3", converter_warps=bad))


def test_scaled_conversion_and_k_in_registers_are_derived():
    """e2m1, e3m2 and e2m3 are converted by bit placement with K straight into the MMA fragments; NVFP4 keeps
    its table, with K in registers at d = 256 only; e4m3 is read as stored. V converts late at d = 256, and
    e2m1 overlaps P.V with the next tile's S."""
    for fmt in ("e2m1", "e3m2", "e2m3"):
        c = HopperConfig(kv_format=fmt, q_dtype="e4m3")
        assert c.scaled_kv and c.k_registers and not c.v_late and replace(c, head_dim=256).v_late
        assert c.overlap == (fmt == "e2m1")
    nvfp4 = HopperConfig(kv_format="nvfp4", q_dtype="e4m3")
    assert not nvfp4.scaled_kv and not nvfp4.k_registers and not nvfp4.overlap
    assert replace(nvfp4, head_dim=256).k_registers and replace(nvfp4, head_dim=256).v_late
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
    # both keep K in registers at d = 256; e2m1 holds a second V tile (overlap), NVFP4 its scale rows
    assert nvfp4.smem_bytes - fp4.smem_bytes == 2 * nvfp4.ring_stages * 128 * (256 // 16) - fp4.tile_bytes
    # ring (2 stages x K and V, 64 packed bytes per key) + two e4m3 V tiles, P, the row statistics, 512 spare
    e2m1 = HopperConfig(kv_format="e2m1", q_dtype="e4m3")
    assert e2m1.smem_bytes == 2 * 2 * 128 * 64 + 2 * 128 * 128 + 16 * (128 + 8) * 2 + 2 * 8 * 16 * 4 + 512
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
