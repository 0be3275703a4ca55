"""Targets as data, the capability rule, and the default plan that decode() and emulate_decode() share."""

import math
from types import SimpleNamespace

import pytest
import torch

from mjolnir_numerics import emulate_decode, get_case
from mjolnir_numerics.capability import HEAD_DIMS, KV_FORMATS, PAGE_SIZES, check_supported, unsupported_reason
from mjolnir_numerics.plan import default_plan, plan_split_kv
from mjolnir_numerics.targets import (
    B200,
    H100,
    H200,
    TARGETS,
    THOR,
    default_target,
    get_target,
    target_for,
    target_of_arch,
)


def test_declared_targets():
    assert set(TARGETS) == {"thor", "b200", "h200", "h100"}
    assert (THOR.arch, THOR.backend, THOR.sm_count) == ("sm_110a", "thor", 20)
    assert (B200.arch, B200.backend, B200.sm_count) == ("sm_100a", "thor", 148)
    assert (
        (H200.arch, H200.backend, H200.sm_count)
        == (H100.arch, H100.backend, H100.sm_count)
        == ("sm_90a", "hopper", 132)
    )
    assert [H200.ctas(d) for d in HEAD_DIMS] == [2, 1] and [THOR.ctas(d) for d in HEAD_DIMS] == [2, 2]
    assert (THOR.max_splits, H200.max_splits) == (16, 32)
    assert get_target("h200") is H200 and get_target(THOR) is THOR
    with pytest.raises(ValueError, match="target: 'a100' is not a Target or one of thor, b200, h200, h100"):
        get_target("a100")
    with pytest.raises(ValueError, match="head_dim: 64 is not one of the thor kernel's head dims"):
        THOR.ctas(64)


@pytest.mark.parametrize(
    "target, n_q, q_dtype, tile",
    [(THOR, 1, "bf16", 8), (THOR, 6, "bf16", 8), (THOR, 9, "bf16", 16), (THOR, 24, "bf16", 32), (THOR, 6, "e4m3", 16),
     (THOR, 17, "e4m3", 32), (THOR, 64, "e4m3", 32), (H200, 1, "e4m3", 8), (H200, 8, "bf16", 8),
     (H200, 9, "e4m3", 16), (H200, 48, "bf16", 16)],
)  # fmt: skip
def test_query_tiles(target, n_q, q_dtype, tile):
    assert target.q_tile(n_q, q_dtype) == tile
    assert target.n_q_tiles(n_q, q_dtype) == math.ceil(n_q / tile)


def test_query_tile_arguments_are_checked():
    with pytest.raises(ValueError, match="n_q: expected an int >= 1"):
        THOR.q_tile(0, "bf16")
    with pytest.raises(ValueError, match="q_dtype: 'fp16'"):
        THOR.q_tile(4, "fp16")


def test_target_of_arch():
    assert target_of_arch("sm_90a") is H200 and target_of_arch("sm_110a") is THOR
    b300 = target_of_arch("sm_103a")
    assert b300.backend == "thor" and b300.arch == "sm_103a" and b300.sm_count == B200.sm_count
    with pytest.raises(ValueError, match="arch: 'sm_80a' is not a decode target"):
        target_of_arch("sm_80a")


def _fake_device(monkeypatch, name, major, minor, sms):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    props = SimpleNamespace(name=name, major=major, minor=minor, multi_processor_count=sms)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


@pytest.mark.parametrize(
    "name, cap, sms, want, want_sms",
    [("NVIDIA H200", (9, 0), 132, "h200", 132), ("NVIDIA H100 PCIe", (9, 0), 114, "h100", 114),
     ("NVIDIA B200", (10, 0), 148, "b200", 148), ("NVIDIA Jetson AGX Thor", (11, 0), 20, "thor", 20)],
)  # fmt: skip
def test_target_for_reads_the_device(monkeypatch, name, cap, sms, want, want_sms):
    _fake_device(monkeypatch, name, *cap, sms)
    t = target_for(0)
    assert t.name == want and t.sm_count == want_sms and t.arch == f"sm_{cap[0]}{cap[1]}a"


def test_target_for_refuses_other_gpus_and_default_target_falls_back_to_thor(monkeypatch):
    _fake_device(monkeypatch, "NVIDIA A100", 8, 0, 108)
    with pytest.raises(ValueError, match="compute capability 8.0"):
        target_for(0)
    assert default_target("cuda:0") is THOR
    assert default_target("cpu") is THOR and default_target(None) is THOR


# -- the capability rule ------------------------------------------------------------------------------
def test_capability_rule():
    for fmt in KV_FORMATS:
        for d in HEAD_DIMS:
            for ps in PAGE_SIZES:
                assert unsupported_reason(fmt, "e4m3", d, ps) is None
                assert (unsupported_reason(fmt, "bf16", d, ps) is None) == (fmt == "e4m3")
    assert "runs only with e4m3 Q" in unsupported_reason("e2m1", "bf16")
    for args, text in [(("e4m3", "bf16", 64), "head_dim: 64"), (("e4m3", "bf16", 128, 8), "page_size: 8"),
                       (("int4", "e4m3"), "kv_format: 'int4'"), (("e4m3", "fp16"), "q_dtype: 'fp16'"),
                       (("e4m3", "bf16", 128.0), "head_dim: 128.0")]:  # fmt: skip
        assert text in unsupported_reason(*args)
        with pytest.raises(ValueError, match=text.replace("(", r"\(")):
            check_supported(*args)


# -- the default plan -----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_q", [1, 6, 24, 36, 48])
def test_thor_default_plan_is_the_thor_kernels(n_q):
    """On Thor: 20 SMs, 2 CTAs per SM, query tiles of up to 32 rows, 16 splits (what the emulator always
    planned by default)."""
    lens = [5000, 300, 0, 129]
    want = plan_split_kv(lens, 4, n_q_tiles=max(1, math.ceil(n_q / 32)), sm_count=20, ctas_per_sm=2, max_splits=16)
    assert default_plan(lens, 4, n_q, target="thor") == want


def test_hopper_default_plan_follows_the_head_dim_and_query_tile():
    lens = [32768] * 2
    p128 = default_plan(lens, 8, 4, target="h200", head_dim=128)
    p256 = default_plan(lens, 8, 4, target="h200", head_dim=256)
    assert p128.slots == 132 * 2 // 8 and p256.slots == 132 // 8
    assert max(p128.n_splits) <= 32 and p128 == plan_split_kv(lens, 8, sm_count=132, ctas_per_sm=2, max_splits=32)
    assert default_plan(lens, 4, 36, target="h200").slots == 132 * 2 // (4 * 3)  # three 16-row query tiles
    assert default_plan([10], 1, 1, target="h200", pad_to=40).num_work == 40


@pytest.mark.parametrize("target", [None, "thor", "h200", "b200"])
def test_emulator_walks_the_default_plan_of_its_target(target):
    """emulate_decode(q, cache) plans with default_plan for its target (None: a CPU cache plans for Thor)."""
    x = get_case("varlen").build()
    got = emulate_decode(x.q, x.cache, q_descale=x.q_descale, target=target, return_details=True).plan
    heads_k = x.cache.heads_k
    rows = x.q.shape[1] // heads_k
    want = default_plan(x.cache.seq_lens, heads_k, rows, target=target or "thor", q_dtype="e4m3", head_dim=128)
    assert got == want


def test_targets_name_their_arithmetic():
    """Hopper: the verified sm90 MMA models and the mma.sync walk; Thor and B200: the predicted sm100 models;
    all: libdevice's log; Hopper the measured sm_90 ex2, the others the correctly rounded one."""
    import dataclasses

    from mjolnir_numerics.targets import Target

    assert (H200.walk, H200.mma_model("e4m3"), H200.mma_model("bf16")) == ("mma_sync_sm90", "sm90_f16", "sm90_bf16")
    assert (THOR.walk, THOR.mma_model("e4m3"), THOR.mma_model("bf16")) == ("tcgen05", "sm100_e4m3", "sm100_bf16")
    assert H200.arithmetic_verified and not THOR.arithmetic_verified and not B200.arithmetic_verified
    assert {t.log for t in TARGETS.values()} == {"libdevice_logf"}
    assert (H200.ex2, H100.ex2) == ("sm90_mufu", "sm90_mufu")
    assert (THOR.ex2, B200.ex2) == ("correctly_rounded", "correctly_rounded")
    assert isinstance(H100, Target)
    with pytest.raises(ValueError, match="mma_bf16_q: 'sm80_bf16' is not one of"):
        dataclasses.replace(THOR, mma_bf16_q="sm80_bf16")
    with pytest.raises(ValueError, match="walk: 'wgmma' is not one of"):
        dataclasses.replace(H200, walk="wgmma")
    with pytest.raises(ValueError, match="log: 'fast' is not one of"):
        dataclasses.replace(H200, log="fast")
    assert {t.tile_streams for t in TARGETS.values()} == {1}  # every kernel walks its tiles front to back
    with pytest.raises(ValueError, match="tile_streams: expected an int in 1..32, got 0"):
        dataclasses.replace(H200, tile_streams=0)
    with pytest.raises(ValueError, match="q_dtype: 'fp16' is not one of"):
        H200.mma_model("fp16")
