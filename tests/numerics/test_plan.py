"""Properties of the occupancy-pinned split-KV plan, and agreement with the seed's planner."""

from __future__ import annotations

import math
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.seed import SEED_PATH, load_seed
from mjolnir_numerics.plan import TILE_KEYS, SplitPlan, chunked_plan, plan_split_kv

EXAMPLES = 200 if os.environ.get("MJOLNIR_TEST_SIZE", "small") == "full" else 40

seq_lens_st = st.lists(st.integers(0, 40_000), min_size=1, max_size=12)
plan_args_st = st.fixed_dictionaries(
    {
        "heads_k": st.integers(1, 8),
        "n_q_tiles": st.integers(1, 3),
        "sm_count": st.sampled_from([1, 8, 20, 132]),
        "ctas_per_sm": st.integers(1, 2),
        "max_splits": st.integers(1, 16),
        "force_splits": st.sampled_from([0, 0, 0, 1, 2, 3, 7, 40]),
        "min_chunk_tiles": st.integers(1, 4),
    }
)


def _tiles(L: int) -> int:
    return max(1, math.ceil(L / TILE_KEYS))


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq_lens_st, plan_args_st)
def test_every_tile_covered_once_in_contiguous_ordered_chunks(seq_lens, args):
    plan = plan_split_kv(seq_lens, **args)
    plan.check(seq_lens)  # raises on any gap, overlap, reordering or wrong slot
    covered = {}
    for b, t0, t1, _ in plan.work:
        for t in range(t0, t1):
            covered[(b, t)] = covered.get((b, t), 0) + 1
    expected = {(b, t) for b, L in enumerate(seq_lens) for t in range(_tiles(L))}
    assert set(covered) == expected
    assert all(n == 1 for n in covered.values())


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq_lens_st, plan_args_st)
def test_chunk_count_and_size_bounds(seq_lens, args):
    plan = plan_split_kv(seq_lens, **args)
    assert max(plan.n_splits) <= args["max_splits"]
    assert plan.chunk_tiles >= args["min_chunk_tiles"] or plan.chunk_tiles >= max(_tiles(L) for L in seq_lens)
    for _, t0, t1, _ in plan.work:
        assert 0 < t1 - t0 <= plan.chunk_tiles
    lengths = [t1 - t0 for _, t0, t1, _ in plan.work]
    assert lengths == sorted(lengths, reverse=True), "work items are ordered longest first"


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq_lens_st, plan_args_st)
def test_wave_bound_and_minimal_chunk(seq_lens, args):
    """Unforced plans fit one wave whenever the batch does, with the smallest chunk that fits."""
    args = dict(args, force_splits=0)
    plan = plan_split_kv(seq_lens, **args)
    tiles = [_tiles(L) for L in seq_lens]
    lo = max(args["min_chunk_tiles"], math.ceil(max(tiles) / args["max_splits"]))
    if len(tiles) >= plan.slots or args["max_splits"] == 1:
        assert plan.n_splits == tuple(1 for _ in tiles)
        return
    assert plan.num_work <= plan.slots or plan.chunk_tiles == lo
    if plan.chunk_tiles > lo:  # one tile smaller would overflow the wave
        assert sum(math.ceil(t / (plan.chunk_tiles - 1)) for t in tiles) > plan.slots


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq_lens_st, st.integers(0, 64))
def test_padding_items_are_empty(seq_lens, extra):
    base = plan_split_kv(seq_lens, 2)
    plan = plan_split_kv(seq_lens, 2, pad_to=base.num_work + extra)
    assert plan.num_work == base.num_work + extra
    assert plan.work[: base.num_work] == base.work
    assert all(w == (0, 0, 0, 0) for w in plan.work[base.num_work :])
    plan.check(seq_lens)
    wt = plan.work_tensor()
    assert wt.dtype == torch.int32 and tuple(wt.shape) == (plan.num_work, 4)


def test_force_splits_cuts_the_longest_sequence():
    plan = plan_split_kv([128 * 40, 128 * 3], 4, force_splits=4)
    assert plan.chunk_tiles == 10 and plan.n_splits == (4, 1)


def test_one_sequence_fills_the_wave():
    plan = plan_split_kv([131072], 4, sm_count=20, ctas_per_sm=2)
    assert plan.slots == 10 and plan.num_work <= 10 and plan.n_splits == (10,)


def test_chunked_plan_matches_the_seed_emulator_chunking():
    plan = chunked_plan([300, 0, 1000], 2)
    plan.check([300, 0, 1000])
    assert plan.n_splits == (2, 1, 4)
    assert chunked_plan([300, 1000], 0).n_splits == (1, 1)


@pytest.mark.parametrize(
    "argument, kwargs",
    [
        ("seq_lens", dict(seq_lens=[-1], heads_k=1)),
        ("seq_lens", dict(seq_lens=[], heads_k=1)),
        ("heads_k", dict(seq_lens=[5], heads_k=0)),
        ("max_splits", dict(seq_lens=[5], heads_k=1, max_splits=0)),
        ("pad_to", dict(seq_lens=[5000, 5000], heads_k=1, pad_to=1)),
    ],
)
def test_bad_arguments_name_the_argument(argument, kwargs):
    with pytest.raises(ValueError, match=argument):
        plan_split_kv(**kwargs)


def test_check_rejects_a_broken_plan():
    good = plan_split_kv([1000], 1, force_splits=2)
    b, t0, t1, j = good.work[0]
    broken = SplitPlan(((b, t0, t1 - 1, j),) + good.work[1:], good.n_splits, good.chunk_tiles, good.slots)
    with pytest.raises(ValueError, match="plan"):
        broken.check([1000])


def _seed_planner():
    if not SEED_PATH.exists():
        pytest.skip(f"seed file {SEED_PATH} is absent")
    return load_seed("plan_split_kv", "SplitPlan", "tile_s_rows").plan_split_kv


@settings(max_examples=EXAMPLES, deadline=None)
@given(seq_lens_st, plan_args_st, st.integers(0, 8))
def test_agrees_with_the_seed_planner(seq_lens, args, extra):
    seed_plan = _seed_planner()
    ours = plan_split_kv(seq_lens, pad_to=0, **args)
    pad = ours.num_work + extra if extra else 0
    ours = plan_split_kv(seq_lens, pad_to=pad, **args)
    theirs = seed_plan(
        seq_lens,
        args["heads_k"],
        args["n_q_tiles"],
        args["sm_count"],
        ctas_per_sm=args["ctas_per_sm"],
        max_splits=args["max_splits"],
        force_splits=args["force_splits"],
        min_chunk_tiles=args["min_chunk_tiles"],
        pad_to=pad,
    )
    assert list(ours.work) == [tuple(w) for w in theirs.work]
    assert list(ours.n_splits) == list(theirs.n_splits)
    assert ours.chunk_tiles == theirs.chunk_tiles and ours.slots == theirs.slots


# ------------------------------------------------------------------------------------------------
# Batch-invariant plans
# ------------------------------------------------------------------------------------------------
def test_batch_invariant_plan_cuts_each_sequence_as_it_would_be_cut_alone():
    from mjolnir_numerics.plan import default_plan

    lens = [5000, 100, 70000, 0, 900]
    p = default_plan(lens, 8, 4, target="h200", mode="batch_invariant")
    p.check(lens)
    for b, L in enumerate(lens):
        alone = default_plan([L], 8, 4, target="h200")
        mine = sorted((w[1], w[2], w[3]) for w in p.work if w[0] == b and w[2] > w[1])
        assert mine == sorted((w[1], w[2], w[3]) for w in alone.work if w[2] > w[1]), L
        assert p.n_splits[b] == alone.n_splits[0]
    occupancy = default_plan(lens, 8, 4, target="h200")
    assert occupancy.n_splits != p.n_splits  # the occupancy plan cuts by the whole batch
    padded = default_plan(lens, 8, 4, target="h200", mode="batch_invariant", pad_to=p.num_work + 3)
    assert padded.num_work == p.num_work + 3 and padded.chunks() == p.chunks()
    with pytest.raises(ValueError, match="mode: 'alone' is not one of occupancy, batch_invariant"):
        default_plan(lens, 8, 4, target="h200", mode="alone")


def _one_sequence_in_batches(plan):
    """Sequence 'x' (3000 keys) decoded alone and inside three batches; its O and LSE in each."""
    from mjolnir_numerics import PagedKVCache, emulate_decode, quantize_q
    from mjolnir_numerics.emulator import EmulatorKnobs

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3000, 2, 128, generator=g), torch.randn(3000, 2, 128, generator=g))
    qx = torch.randn(1, 8, 128, generator=g)
    others = [(torch.randn(n, 2, 128, generator=g), torch.randn(n, 2, 128, generator=g), torch.randn(1, 8, 128,
              generator=g)) for n in (40000, 200, 7000, 12000)]  # fmt: skip
    outs = []
    for batch in ([], others[:1], others[1:3], others):
        ks, vs, qs = [x[0]] + [o[0] for o in batch], [x[1]] + [o[1] for o in batch], [qx] + [o[2] for o in batch]
        cache = PagedKVCache.from_float(ks, vs, "e4m3", page_size=64, granularity="per_seq_head")
        q, qd = quantize_q(torch.cat(qs).to(torch.bfloat16), len(ks), 1, 2)
        o, lse = emulate_decode(q, cache, q_descale=qd, plan=plan, knobs=EmulatorKnobs(mma="ideal"))
        outs.append((o[:1], lse[:1]))
    return outs


def test_batch_invariant_plan_gives_a_sequence_the_same_bits_in_any_batch():
    outs = _one_sequence_in_batches("batch_invariant")
    for o, lse in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0][0].view(torch.int16))
        assert torch.equal(lse.view(torch.int32), outs[0][1].view(torch.int32))
    occ = _one_sequence_in_batches(None)  # the occupancy plan: its bits move with the batch
    assert any(not torch.equal(o.view(torch.int16), occ[0][0].view(torch.int16)) for o, _ in occ[1:])
