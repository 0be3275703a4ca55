"""Synthetic K/V generators: every kind has the property it claims (docs/data.md, "What real K/V look like")."""

import math

import pytest
import torch

from mjolnir_numerics.synthetic import KINDS, apply_rope, attention_probs, make_kv, rope_inv_freq

# GQA group 4, d = 64: a typical small decode shape; lengths long enough for channel statistics.
SHAPE = {"num_seqs": 2, "heads_q": 8, "heads_k": 2, "head_dim": 64}

# Sampling tolerance for a per-channel std estimated from n = 2 * 2048 Gaussian samples: the relative
# standard error is 1 / sqrt(2n) ~ 1.1%; 5% is > 4 sigma.
STD_REL_TOL = 0.05

# Planted masses are solved in closed form; what is left is float32 rounding of logits near 10.
PLANTED_MASS_ATOL = 1e-4


def test_registry_lists_the_six_kinds():
    assert set(KINDS) == {"gaussian", "outlier_keys", "rope_outliers", "sinks", "heavy_tail", "peaked"}
    for name, spec in KINDS.items():
        assert spec.name == name and spec.summary


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("q_len", [1, 3])
def test_shapes_dtypes_and_layout(kind, q_len):
    data = make_kv(kind, seq_len=64, q_len=q_len, seed=3, **SHAPE)
    assert data.q.shape == (2 * q_len, 8, 64) and data.q.dtype == torch.float32
    for x in (data.k, data.v):
        assert x.shape == (2, 64, 2, 64) and x.dtype == torch.float32
        assert torch.isfinite(x).all()
    assert torch.isfinite(data.q).all()
    assert data.seq_lens == (64, 64) and data.softmax_scale == 64**-0.5
    assert data.meta["q_positions"].tolist() == [list(range(64 - q_len, 64))] * 2


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_ragged_lengths_give_lists(kind):
    lens = [40, 17, 65]
    data = make_kv(kind, num_seqs=3, seq_len=lens, heads_q=6, heads_k=3, head_dim=32, q_len=2, seed=0)
    assert isinstance(data.k, list) and isinstance(data.v, list)
    assert [tuple(k.shape) for k in data.k] == [(n, 3, 32) for n in lens]
    assert [tuple(v.shape) for v in data.v] == [(n, 3, 32) for n in lens]
    assert data.q.shape == (6, 6, 32)
    probs = attention_probs(data)
    for p, n in zip(probs, lens):
        assert p.shape == (2, 6, n)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 6), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_seed_reproduces_and_generator_matches_seed(kind):
    a = make_kv(kind, seq_len=48, seed=11, **SHAPE)
    b = make_kv(kind, seq_len=48, generator=torch.Generator().manual_seed(11), **SHAPE)
    c = make_kv(kind, seq_len=48, seed=12, **SHAPE)
    for name in ("q", "k", "v"):
        assert torch.equal(getattr(a, name), getattr(b, name))
        assert not torch.equal(getattr(a, name), getattr(c, name))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kind": "nope"}, "kind='nope'"),
        ({"heads_q": 6}, "heads_q=6"),
        ({"head_dim": 63}, "head_dim=63"),
        ({"seq_len": 2, "q_len": 3}, "seq_len=2"),
        ({"seq_len": [8]}, "seq_len has 1 entries"),
        ({"num_seqs": 0}, "num_seqs=0"),
        ({"bogus": 1}, "bogus"),
        ({"kind": "sinks", "sink_mass": 1.5}, "sink_mass=1.5"),
        ({"kind": "peaked", "sink_mass": 0.6, "recent_mass": 0.5}, "sum to"),
        ({"kind": "peaked", "q_len": 4, "n_recent": 2}, "n_recent=2"),
        ({"kind": "peaked", "seq_len": 8, "n_recent": 8}, "seq_lens="),
        ({"kind": "outlier_keys", "outlier_scale": (50, 10)}, "outlier_scale="),
        ({"kind": "rope_outliers", "rope_theta": -1.0}, "theta=-1.0"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(kwargs, message):
    args = {"kind": "gaussian", "num_seqs": 2, "seq_len": 32, "heads_q": 8, "heads_k": 4, "head_dim": 64, "q_len": 1}
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make_kv(**args)


def test_cuda_data_equals_cpu_data():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the device argument is only exercised on a GPU machine")
    cpu = make_kv("peaked", seq_len=[50, 70], seed=5, num_seqs=2, heads_q=8, heads_k=2, head_dim=64, q_len=2)
    gpu = make_kv(
        "peaked", seq_len=[50, 70], seed=5, num_seqs=2, heads_q=8, heads_k=2, head_dim=64, q_len=2, device="cuda"
    )
    assert gpu.q.is_cuda and all(k.is_cuda for k in gpu.k)
    assert torch.equal(cpu.q, gpu.q.cpu()) and all(torch.equal(a, b.cpu()) for a, b in zip(cpu.k, gpu.k))


# ---------------------------------------------------------------------------------------------- RoPE
def test_rope_matches_hand_computed_rotation():
    # d = 4, theta = 100: pair 0 turns 1 rad per position, pair 1 turns 100^(-1/2) = 0.1 rad.
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])  # (T=1, H=1, D=4)
    pos = torch.tensor([3])
    a0, a1 = 3.0, 0.3

    def rot(a, b, t):
        return a * math.cos(t) - b * math.sin(t), a * math.sin(t) + b * math.cos(t)

    inter = [*rot(1.0, 2.0, a0), *rot(3.0, 4.0, a1)]
    y0, y2 = rot(1.0, 3.0, a0)
    y1, y3 = rot(2.0, 4.0, a1)
    half = [y0, y1, y2, y3]
    torch.testing.assert_close(apply_rope(x, pos, 100.0, True)[0, 0], torch.tensor(inter), rtol=0, atol=1e-6)
    torch.testing.assert_close(apply_rope(x, pos, 100.0, False)[0, 0], torch.tensor(half), rtol=0, atol=1e-6)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("theta", [1e4, 5e5])
def test_rope_preserves_pair_norms_inverts_and_is_relative(interleaved, theta):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 300, 3, 64, generator=g)
    pos = torch.arange(300) * 37  # long positions: up to ~11K
    y = apply_rope(x, pos, theta, interleaved)

    def pair_norms(t):
        a, b = (t[..., 0::2], t[..., 1::2]) if interleaved else (t[..., :32], t[..., 32:])
        return torch.hypot(a, b)

    torch.testing.assert_close(pair_norms(y), pair_norms(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rope(y, -pos, theta, interleaved), x, rtol=1e-5, atol=1e-5)
    # q.k after RoPE depends only on the position difference: shift both by 1000.
    q, k = x[:, :1], x[:, 1:2]
    dots = [
        (
            apply_rope(q, torch.tensor([s + 50]), theta, interleaved)
            * apply_rope(k, torch.tensor([s]), theta, interleaved)
        ).sum(-1)
        for s in (0, 1000)
    ]
    torch.testing.assert_close(dots[0], dots[1], rtol=1e-4, atol=1e-4)


def test_rope_inv_freq_is_decreasing_and_starts_at_one():
    f = rope_inv_freq(64, 1e5)
    assert f[0] == 1 and (f[1:] < f[:-1]).all() and math.isclose(f[-1].item(), 1e5 ** (-62 / 64))


# ------------------------------------------------------------------------------------------- kinds
def _channel_std(k: torch.Tensor) -> torch.Tensor:
    """(S, L, H, D) -> (H, D) std over sequences and tokens."""
    return k.transpose(0, 2).reshape(k.shape[2], -1, k.shape[3]).std(dim=1)


def test_gaussian_logit_std_matches_knob():
    for logit_std in (1.0, 2.5):
        data = make_kv("gaussian", seq_len=2048, seed=1, logit_std=logit_std, **SHAPE)
        q = data.q.view(2, 1, 8, 64)
        logits = data.softmax_scale * torch.einsum("sjhd,slhd->sjhl", q, data.k.repeat_interleave(4, dim=2))
        torch.testing.assert_close(logits.std(-1).mean(), torch.tensor(logit_std), rtol=0.05, atol=0)


def test_outlier_keys_channels_are_10_to_50x_the_median_and_v_is_flat():
    data = make_kv("outlier_keys", seq_len=2048, seed=2, **SHAPE)
    std = _channel_std(data.k)  # (H_k, D)
    ratio = std / std.median(dim=1, keepdim=True).values
    channels = data.meta["outlier_channels"]
    assert channels.shape == (2, 4)
    out = ratio.gather(1, channels)
    assert (out > 10 * (1 - STD_REL_TOL)).all() and (out < 50 * (1 + STD_REL_TOL)).all()
    torch.testing.assert_close(out, data.meta["outlier_stds"], rtol=STD_REL_TOL, atol=0)
    rest = ratio.scatter(1, channels, 1.0)
    assert (rest - 1).abs().max() < 0.1
    v_std = _channel_std(data.v)
    assert (v_std / v_std.median(dim=1, keepdim=True).values).max() < 1.1


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("theta", [1e4, 5e5])
def test_rope_outliers_sit_in_low_frequency_pairs_and_rotate(interleaved, theta):
    data = make_kv("rope_outliers", seq_len=2048, seed=4, rope_theta=theta, interleaved=interleaved, **SHAPE)
    pairs, channels = data.meta["outlier_pairs"], data.meta["outlier_channels"]
    assert (pairs >= 32 - 64 // 8).all() and (pairs < 32).all()  # the d/8 slowest pairs
    # Undo RoPE: the pre-RoPE outlier channels are 10-50x the median std.
    pre = apply_rope(data.k, -torch.arange(2048), theta, interleaved)
    std = _channel_std(pre)
    ratio = (std / std.median(dim=1, keepdim=True).values).gather(1, channels.flatten(1)).view_as(channels)
    assert (ratio > 10 * (1 - STD_REL_TOL)).all() and (ratio < 50 * (1 + STD_REL_TOL)).all()
    # RoPE keeps each pair's norm: the post-RoPE pair RMS carries the same ratio.
    a, b = (data.k[..., 0::2], data.k[..., 1::2]) if interleaved else (data.k[..., :32], data.k[..., 32:])
    pair_rms = (a.square() + b.square()).mean(dim=(0, 1)).sqrt()  # (H_k, 32)
    pair_ratio = (pair_rms / pair_rms.median(dim=1, keepdim=True).values).gather(1, pairs)
    torch.testing.assert_close(pair_ratio, data.meta["outlier_stds"], rtol=STD_REL_TOL, atol=0)
    # ... and the keys really were rotated: post-RoPE differs from pre-RoPE beyond position 0.
    assert not torch.allclose(pre[:, 1:], data.k[:, 1:])


@pytest.mark.parametrize("q_len", [1, 4])
def test_sink_takes_30_to_50_percent_with_a_logit_gap_of_5_to_10(q_len):
    data = make_kv("sinks", seq_len=1024, q_len=q_len, seed=6, **SHAPE)
    probs = torch.stack(attention_probs(data))  # (S, q_len, H_q, L)
    sink_mass = probs[..., 0]
    assert ((sink_mass >= 0.3) & (sink_mass <= 0.5)).all()
    torch.testing.assert_close(sink_mass, torch.full_like(sink_mass, 0.4), rtol=0, atol=PLANTED_MASS_ATOL)
    # Independent logit gap: sink logit minus the mean logit of the other visible keys.
    q = data.q.view(2, q_len, 8, 64)
    logits = data.softmax_scale * torch.einsum("sjhd,slhd->sjhl", q, data.k.repeat_interleave(4, dim=2))
    for j in range(q_len):
        n_visible = 1024 - q_len + j + 1
        gap = logits[:, j, :, 0] - logits[:, j, :, 1:n_visible].mean(-1)
        assert ((gap > 5) & (gap < 10)).all(), gap
    torch.testing.assert_close(data.meta["groups"]["sink"]["mass"], sink_mass, rtol=0, atol=PLANTED_MASS_ATOL)


def test_sink_mass_knob_and_several_sinks():
    data = make_kv("sinks", seq_len=512, seed=7, n_sinks=4, sink_mass=0.3, **SHAPE)
    mass = torch.stack(attention_probs(data))[..., :4].sum(-1)
    torch.testing.assert_close(mass, torch.full_like(mass, 0.3), rtol=0, atol=PLANTED_MASS_ATOL)


@pytest.mark.parametrize("q_len", [1, 4])
def test_peaked_heads_put_most_mass_on_sink_and_recent_tokens(q_len):
    lens = [4096, 700]
    data = make_kv("peaked", seq_len=lens, q_len=q_len, seed=8, **SHAPE)
    for p, n in zip(attention_probs(data), lens):
        sink, recent = p[..., 0], p[..., n - 8 :].sum(-1)
        torch.testing.assert_close(sink, torch.full_like(sink, 0.3), rtol=0, atol=PLANTED_MASS_ATOL)
        torch.testing.assert_close(recent, torch.full_like(recent, 0.5), rtol=0, atol=PLANTED_MASS_ATOL)
        # The remaining 20% is spread thin: no single middle token comes close to the sink.
        assert p[..., 1 : n - 8].max() < 0.05


def test_heavy_tail_fraction_and_exceedance_rate():
    data = make_kv("heavy_tail", seq_len=4096, seed=9, num_seqs=4, heads_q=8, heads_k=4, head_dim=64)
    n = data.k.numel()  # 4.2M elements
    for frac in (data.meta["tail_fraction"], data.meta["v_tail_fraction"]):
        assert abs(frac - 1e-3) < 5 * math.sqrt(1e-3 / n)
    # |x| > 4 happens with prob p * P(|N(0, 1 + 100)| > 4) + (1 - p) * P(|N(0,1)| > 4).
    p, t = 1e-3, 4.0
    expected = p * math.erfc(t / math.sqrt(2 * 101)) + (1 - p) * math.erfc(t / math.sqrt(2))
    for x in (data.k, data.v):
        rate = (x.abs() > t).float().mean().item()
        assert abs(rate - expected) < 5 * math.sqrt(expected / n), (rate, expected)
    # The Gaussian kind has (almost) no such values: the tail is what makes the difference.
    plain = make_kv("gaussian", seq_len=4096, seed=9, num_seqs=4, heads_q=8, heads_k=4, head_dim=64)
    assert (plain.k.abs() > t).float().mean().item() < expected / 5
