"""ThorConfig, derived quantities and can_implement (pure Python: runs everywhere)."""

import pytest

from mjolnir_kernel.config import ConfigError, can_implement, default_config
from mjolnir_kernel.thor.config import KV_FORMATS, ThorConfig
from mjolnir_numerics.targets import THOR


def test_default_config_is_implementable():
    can_implement(ThorConfig())


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"head_dim": 192}, ["head_dim: 192"]),
        ({"page_size": 8}, ["page_size: 8"]),
        ({"q_tile": 12}, ["q_tile=12"]),
        ({"q_len": 0}, ["q_len=0"]),
        ({"kv_format": "fp8"}, ["kv_format: 'fp8'"]),
        ({"q_dtype": "fp16"}, ["q_dtype: 'fp16'"]),
        ({"ctas_per_sm": 3}, ["ctas_per_sm=3"]),
        ({"max_splits": 0}, ["max_splits=0"]),
        ({"q_tile": 12, "max_splits": 0}, ["q_tile=12", "max_splits=0"]),  # every offender is named
    ],
)
def test_field_errors_name_the_field_and_value(kwargs, names):
    with pytest.raises(ConfigError) as e:
        can_implement(ThorConfig(**kwargs))
    for n in names:
        assert n in str(e.value)
    assert "allowed" in str(e.value) or "one of" in str(e.value)


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"kv_format": "e2m3", "q_dtype": "bf16"}, "runs only with e4m3 Q"),
        ({"kv_format": "nvfp4", "q_dtype": "bf16"}, "runs only with e4m3 Q"),
        ({"q_dtype": "e4m3", "q_tile": 8}, "q_tile=8 with q_dtype='e4m3'"),
        ({"ring_stages": 40}, "ring_stages=40"),
    ],
)
def test_combination_errors(kwargs, text):
    with pytest.raises(ConfigError, match="cannot be implemented") as e:
        can_implement(ThorConfig(**kwargs))
    assert text in str(e.value)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_frozen_and_hashable_compile_key():
    a = ThorConfig(head_dim=256, q_dtype="e4m3", q_tile=16, kv_format="e2m3")
    b = ThorConfig(head_dim=256, q_dtype="e4m3", q_tile=16, kv_format="e2m3")
    assert a == b and hash(a) == hash(b) and a.key() == b.key()
    from dataclasses import FrozenInstanceError

    with pytest.raises(FrozenInstanceError):
        a.head_dim = 128
    assert a != ThorConfig(head_dim=256, q_dtype="e4m3", q_tile=16, kv_format="e2m3", ring_stages=3)


def test_evict_first_follows_the_q_path():
    assert ThorConfig(q_dtype="e4m3").evict_first and not ThorConfig(q_dtype="bf16").evict_first
    assert ThorConfig(q_dtype="e4m3").short_name().endswith("-ef")


@pytest.mark.parametrize(
    "n_q, q_dtype, tile",
    [
        (1, "bf16", 8),
        (6, "bf16", 8),
        (9, "bf16", 16),
        (24, "bf16", 32),
        (6, "e4m3", 16),
        (17, "e4m3", 32),
        (64, "e4m3", 32),
    ],
)
def test_query_tile(n_q, q_dtype, tile):
    assert THOR.q_tile(n_q, q_dtype) == tile


def test_derived_register_budget_fits_the_pool():
    for ctas in (1, 2):
        for q_dtype, fmt in (("bf16", "e4m3"), ("e4m3", "e4m3"), ("e4m3", "nvfp4")):
            for tile in (16, 32):
                for d in (128, 256):
                    c = ThorConfig(head_dim=d, q_tile=tile, q_dtype=q_dtype, kv_format=fmt, ctas_per_sm=ctas)
                    can_implement(c)
                    dv = c.derived
                    assert dv.launch_regs * dv.threads * ctas <= 64 * 1024
                    if dv.reg_reconfig:
                        pool = dv.launch_regs * (dv.threads // 128)
                        assert dv.mma_tma_regs + dv.convert_regs * dv.convert_warpgroups + dv.softmax_regs <= pool
                        assert dv.mma_tma_regs <= dv.launch_regs <= dv.softmax_regs
                        for r in (dv.mma_tma_regs, dv.convert_regs, dv.softmax_regs):
                            assert 24 <= r <= 256 and r % 8 == 0
                    assert dv.tmem_cols <= dv.tmem_capacity and dv.tmem_cols & (dv.tmem_cols - 1) == 0
                    assert 1 <= dv.kv_stages <= dv.max_kv_stages_fit


def test_default_ring_is_whole_tiles_except_fp6():
    c = ThorConfig(head_dim=256, q_dtype="e4m3", kv_format="e4m3")
    assert c.derived.kv_stages == c.derived.stages_per_tile == 4
    c1 = ThorConfig(head_dim=256, q_dtype="e4m3", kv_format="e4m3", ctas_per_sm=1)
    assert c1.derived.kv_stages == 8
    fp6 = ThorConfig(head_dim=256, q_dtype="e4m3", kv_format="e3m2")
    assert fp6.derived.kv_stages == 2


def test_short_names_are_unique_over_the_matrix():
    from mjolnir_kernel.compile import compile_matrix

    m = compile_matrix("sm_110a")
    assert len(m) == 3 * 2 * 2 * 2 * (1 + len(KV_FORMATS)) == 144  # q_len x page x split x d x (Q, format)
    assert len({c.short_name() for c in m}) == len(m)
    for c in m:
        can_implement(c)


def test_fields_of_the_wrong_type_are_named_not_crashed_on():
    """A string ring_stages fails at construction with the field named (it used to raise a TypeError from
    a derived quantity); None head_dim / page_size and a float q_tile are refused, not skipped."""
    from mjolnir_kernel.config import can_implement, default_config
    from mjolnir_kernel.hopper.config import HopperConfig

    with pytest.raises(ConfigError, match="ring_stages='3'"):
        ThorConfig(ring_stages="3")
    for cfg, text in ((HopperConfig(head_dim=None), "head_dim=None"), (ThorConfig(page_size=None), "page_size=None"),
                      (HopperConfig(q_tile=16.0), "q_tile=16.0")):  # fmt: skip
        with pytest.raises(ConfigError, match=text):
            can_implement(cfg)
    kw = dict(head_dim=128, page_size=16, q_len=2, kv_format="e4m3", q_dtype="bf16", n_q=4)
    with pytest.raises(TypeError, match="causal: expected True or False"):
        default_config("thor", **kw, causal="x")
    with pytest.raises(TypeError, match="head_dim: expected an int"):
        default_config("thor", **{**kw, "head_dim": None})


def test_default_config_takes_one_cta_per_sm_where_two_would_spill():
    """32-row tiles with a convert warpgroup (bf16 Q or NVFP4 KV) compile at 1 CTA per SM by default (their
    2-CTA register split spills; reports/thor/2026-12-02-spills.md); everything else keeps the target's."""
    from mjolnir_kernel.thor.config import default_ctas

    assert default_ctas(2, 32, "bf16", "e4m3") == 1
    assert default_ctas(2, 32, "e4m3", "nvfp4") == 1
    assert default_ctas(2, 32, "e4m3", "e4m3") == 2  # no convert warpgroup: 128 registers at 2 CTAs
    assert default_ctas(2, 16, "bf16", "e4m3") == 2
    assert default_ctas(1, 32, "bf16", "e4m3") == 1
    wide = default_config(THOR, head_dim=128, page_size=16, q_len=4, kv_format="e4m3", q_dtype="bf16", n_q=24)
    narrow = default_config(THOR, head_dim=128, page_size=16, q_len=1, kv_format="e4m3", q_dtype="bf16", n_q=6)
    assert (wide.q_tile, wide.ctas_per_sm) == (32, 1)
    assert (narrow.q_tile, narrow.ctas_per_sm) == (8, THOR.ctas(128))
