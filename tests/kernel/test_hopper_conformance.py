"""The Hopper (sm_90a) kernel against the spec (mjolnir_numerics.emulate_decode): the shared named cases
and the Thor conformance file's kernel cases, run on a compute capability 9.0 GPU (the lent H200);
skips with the reason elsewhere. Tolerances: mjolnir_kernel.conformance (named, derived there)."""

import math

import pytest
import torch

from mjolnir_kernel.arch import hopper_device_reason
from mjolnir_kernel.compile import cutlass_available
from mjolnir_kernel.conformance import (
    FP8_MMA_REL_ERROR,
    KERNEL_CASES,
    WGMMA_LSE_SPEC_ULPS,
    WGMMA_O_ERROR_FACTOR,
    WGMMA_O_ERROR_SLACK,
    compare_outputs,
    p_flip_atol,
    permute_pages,
    score_magnitude_max,
)
from mjolnir_kernel.config import SMEM_PER_CTA_MAX
from mjolnir_kernel.hopper.config import KV_FORMATS, Q_TILE, SCALED_KV_FORMATS, HopperConfig
from mjolnir_numerics.cases import CASES, DecodeCase
from mjolnir_numerics.plan import plan_split_kv

_REASON = cutlass_available() or hopper_device_reason()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_REASON is not None, reason=f"Hopper conformance needs an sm_90 GPU: {_REASON}"),
]

HOPPER_CASES = tuple(c for c in CASES + KERNEL_CASES if c.fmt in KV_FORMATS) + (
    DecodeCase("hopper_d256_bf16_24_4", (700, 129), q_dtype="bf16", heads_q=24, heads_k=4, head_dim=256),
    DecodeCase("hopper_32_8_d128_ps64", (1500, 3), heads_q=32, heads_k=8, page_size=64, layout="hnd"),
    DecodeCase("hopper_n_q_above_tile", (300, 290), q_len=3, heads_q=48, heads_k=4, notes="n_q 36: three q tiles"),
    DecodeCase("hopper_q_len2_noncausal_bf16", (140, 5), q_len=2, causal=False, q_dtype="bf16"),
    DecodeCase("hopper_e3m2_d256_splits", (900, 129), fmt="e3m2", heads_q=24, heads_k=4, head_dim=256,
               force_splits=3, notes="fp6 at d = 256 (two P.V chunks per warp), three chunks"),
    DecodeCase("hopper_e2m3_per_seq_head", (260, 7), fmt="e2m3", heads_q=32, heads_k=8, page_size=32,
               granularity="per_seq_head", notes="fp6 with per-(sequence, head) descales"),
    DecodeCase("hopper_nvfp4_d256", (600, 129), fmt="nvfp4", heads_q=24, heads_k=4, head_dim=256,
               granularity="per_tensor", force_splits=2,
               notes="NVFP4 at d = 256: K in registers and V late by default, two chunks"),
)  # fmt: skip


def _plan(case: DecodeCase):
    rows = case.q_len * (case.heads_q // case.heads_k)
    return plan_split_kv(
        list(case.seq_lens), case.heads_k, n_q_tiles=max(1, math.ceil(rows / Q_TILE)), sm_count=132,
        force_splits=case.force_splits,
    )  # fmt: skip


def _run_both(case: DecodeCase, **kernel_options):
    from mjolnir_kernel import decode
    from mjolnir_numerics.emulator import emulate_decode

    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    if kw["plan"] is None:  # pin one plan (16-row query tiles, 132 SMs) for both sides
        kw["plan"] = _plan(case)
    o, lse = decode(inputs.q, inputs.cache, **kw, **kernel_options)
    o_ref, lse_ref = emulate_decode(inputs.q, inputs.cache, **kw)
    return inputs, kw, (o, lse), (o_ref, lse_ref)


def _flip_atol(inputs, case: DecodeCase) -> float:
    """The P-flip bound of mjolnir_kernel.conformance for this case's V values and descales."""
    cache = inputs.cache
    ps = cache.page_size
    lens = cache.seq_lens.tolist()
    used = [cache.block_table[i, : -(-L // ps)] for i, L in enumerate(lens) if L > 0]
    v_abs = float(cache.page_values("v", torch.cat(used)).abs().max()) if used else 0.0
    return p_flip_atol(v_abs, float(cache.v_descale.max()), 1.0, case.q_dtype)


@pytest.mark.parametrize("case", HOPPER_CASES, ids=lambda c: c.name)
def test_hopper_matches_spec(case):
    inputs, _, (o, lse), (o_ref, lse_ref) = _run_both(case)
    assert not torch.isnan(o.float()).any(), f"{case.name}: NaN in O (stray read of a poisoned page?)"
    report = compare_outputs(o.cpu(), lse.cpu(), o_ref.cpu(), lse_ref.cpu(), o_flip_atol=_flip_atol(inputs, case))
    print(f"CONFORMANCE {case.name}: {report.summary()}")
    assert report.ok, f"{case.name}: {report.summary()}"


PACKED_CASES = tuple(c for c in HOPPER_CASES if c.fmt != "e4m3")


@pytest.mark.parametrize("case", PACKED_CASES, ids=lambda c: c.name)
def test_hopper_packed_k_paths_match_spec(case):
    """Both ways sub-byte K reaches the MMAs (``HopperConfig.k_operand``: an e4m3 tile in shared memory, or
    each warp's own codes converted into its fragments, with Q's head dims in the matching order) meet the
    spec's tolerances. The registers path adds S's products in another head-dim order, so its bits may
    differ from the tile path's; the test prints how many agree."""
    from mjolnir_kernel import decode

    inputs, kw, _, (o_ref, lse_ref) = _run_both(case)
    flip = _flip_atol(inputs, case)
    outs = {}
    for k_operand in ("tile", "registers"):
        o, lse = decode(inputs.q, inputs.cache, **kw, k_operand=k_operand)
        assert not torch.isnan(o.float()).any(), f"{case.name}: NaN in O ({k_operand})"
        report = compare_outputs(o.cpu(), lse.cpu(), o_ref.cpu(), lse_ref.cpu(), o_flip_atol=flip)
        print(f"CONFORMANCE {case.name} k_operand={k_operand}: {report.summary()}")
        assert report.ok, f"{case.name} k_operand={k_operand}: {report.summary()}"
        outs[k_operand] = (o, lse)
    (o_t, lse_t), (o_r, lse_r) = outs["tile"], outs["registers"]
    same_o = (o_t.view(torch.int16) == o_r.view(torch.int16)).float().mean().item()
    same_lse = (lse_t.view(torch.int32) == lse_r.view(torch.int32)).float().mean().item()
    print(f"K PATHS {case.name}: registers vs tile: {same_o:.2%} of O, {same_lse:.2%} of LSE bit-identical")


WGMMA_CASES = tuple(c for c in HOPPER_CASES if c.q_dtype == "e4m3")


def _wgmma_fits(case: DecodeCase, v_operand: str) -> bool:
    """The wgmma config of this case and V^T operand fits shared memory (the f16 V^T tile of an fp6 format
    at d = 256 does not: 239 KB against 227 KB per CTA)."""
    cfg = HopperConfig(head_dim=case.head_dim, page_size=case.page_size, q_len=case.q_len, kv_format=case.fmt,
                       q_dtype="e4m3", mma="wgmma", v_operand=v_operand)  # fmt: skip
    return cfg.smem_bytes <= SMEM_PER_CTA_MAX


WGMMA_V_CASES = [
    pytest.param(case, v, id=f"{case.name}-{v}")
    for case in WGMMA_CASES
    for v in ("registers", "smem", "f16")
    if _wgmma_fits(case, v)
]


@pytest.mark.parametrize("case, v_operand", WGMMA_V_CASES)
def test_hopper_wgmma_stays_within_the_fp8_mma_bound(case, v_operand):
    """The experimental fp8 warpgroup-MMA path (keys on M) is not bit-faithful: Hopper's fp8 tensor cores
    do not add exactly (conformance.FP8_MMA_REL_ERROR). What must hold: its LSE is within that error of
    the spec's, propagated through logsumexp, and its O is no further from the exact float64 reference
    than the spec's own O plus a fraction of a bf16 step. For each way V^T reaches the tensor cores
    (``HopperConfig.v_operand``); with "f16" only S is an fp8 MMA."""
    from mjolnir_numerics.reference import reference_decode

    inputs, kw, (o, lse), (o_spec, lse_spec) = _run_both(case, mma="wgmma", v_operand=v_operand)
    spec_report = compare_outputs(o.cpu(), lse.cpu(), o_spec.cpu(), lse_spec.cpu())
    print(f"WGMMA-{v_operand} {case.name} vs spec: {spec_report.summary()}")
    assert not torch.isnan(o.float()).any(), f"{case.name}: NaN in O"
    lse, lse_spec = lse.cpu().double(), lse_spec.cpu().double()
    finite = torch.isfinite(lse_spec)
    assert torch.equal(torch.isfinite(lse), finite), f"{case.name}: -inf LSE rows differ"
    scale = kw["softmax_scale"] or 1.0 / math.sqrt(case.head_dim)
    mag = score_magnitude_max(inputs.q, inputs.cache, kw["q_descale"], scale, case.q_len)
    bound = FP8_MMA_REL_ERROR * mag + WGMMA_LSE_SPEC_ULPS * 2.0**-23 * lse_spec.abs().clamp_min(1.0)
    excess = ((lse - lse_spec).abs() - bound)[finite]
    assert (excess <= 0).all(), f"{case.name}: LSE off by {excess.max().item():.3g} beyond the fp8 MMA bound"

    o_x, _ = reference_decode(inputs.q, inputs.cache, q_descale=kw["q_descale"], softmax_scale=kw["softmax_scale"],
                              q_len=case.q_len, causal=case.causal)  # fmt: skip
    o_x = o_x.cpu()
    norm = o_x.norm().clamp_min(1e-300)
    err_wg = ((o.cpu().double() - o_x).norm() / norm).item()
    err_spec = ((o_spec.cpu().double() - o_x).norm() / norm).item()
    print(f"WGMMA-{v_operand} {case.name}: rel L2 to exact {err_wg:.3e} (spec {err_spec:.3e}), "
          f"max |dLSE| {(lse - lse_spec).abs()[finite].max().item() if finite.any() else 0:.2e}")  # fmt: skip
    allowed = WGMMA_O_ERROR_FACTOR * err_spec + WGMMA_O_ERROR_SLACK
    assert err_wg <= allowed, f"{case.name}: O {err_wg:.3e} from exact vs the spec's {err_spec:.3e}"


@pytest.mark.parametrize("case", WGMMA_CASES, ids=lambda c: c.name)
def test_hopper_wgmma_v_through_shared_memory_gives_the_register_paths_bits(case):
    """v_operand="smem" stores the same e4m3 V^T fragments to shared memory and reads them back as a
    K-major wgmma operand: the tensor cores multiply the same bytes in the same order, so O and LSE
    must not move a bit against the register operand."""
    from mjolnir_kernel import decode

    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    if kw["plan"] is None:
        kw["plan"] = _plan(case)
    o_r, lse_r = decode(inputs.q, inputs.cache, **kw, mma="wgmma")
    o_s, lse_s = decode(inputs.q, inputs.cache, **kw, mma="wgmma", v_operand="smem")
    assert torch.equal(o_s.view(torch.int16), o_r.view(torch.int16)), f"{case.name}: O differs"
    assert torch.equal(lse_s.view(torch.int32), lse_r.view(torch.int32)), f"{case.name}: LSE differs"


# load-path variants that must not change a bit: (name, decode options, KV formats they apply to)
LOAD_VARIANTS = (
    ("bulk", {"loads": "bulk"}, ("e4m3",)),
    ("tma", {"loads": "tma"}, ("e4m3",)),
    ("no_evict_first", {"evict_first": False}, KV_FORMATS),
    ("prefetch_256", {"prefetch": 256}, KV_FORMATS),
    ("exact_convert", {"kv_convert": "exact"}, SCALED_KV_FORMATS),
    ("v_convert_early", {"v_convert": "early"}, SCALED_KV_FORMATS),
    ("v_convert_late", {"v_convert": "late"}, SCALED_KV_FORMATS),
    ("schedule_serial", {"schedule": "serial"}, SCALED_KV_FORMATS),
    ("schedule_overlap", {"schedule": "overlap"}, SCALED_KV_FORMATS),
    ("schedule_overlap_3_stages", {"schedule": "overlap", "ring_depth": 3}, SCALED_KV_FORMATS),
    ("schedule_overlap_nvfp4", {"schedule": "overlap", "k_operand": "registers"}, ("nvfp4",)),
    ("mma_layout_keys", {"mma_layout": "keys"}, SCALED_KV_FORMATS),
    ("mma_layout_keys_overlap", {"mma_layout": "keys", "schedule": "overlap"}, SCALED_KV_FORMATS),
    ("mma_layout_keys_nvfp4", {"mma_layout": "keys", "k_operand": "registers"}, ("nvfp4",)),
)
LOAD_VARIANT_CASES = [
    pytest.param(name, opts, c, id=f"{name}-{c.name}")
    for name, opts, fmts in LOAD_VARIANTS
    for c in HOPPER_CASES
    # (keys on M needs the 8-row query tile: at most 8 query rows per KV head)
    if c.fmt in fmts and ("mma_layout" not in opts or c.q_len * (c.heads_q // c.heads_k) <= 8)
]


@pytest.mark.parametrize("variant, options, case", LOAD_VARIANT_CASES)
def test_hopper_load_paths_give_the_same_bits(variant, options, case):
    """How the KV bytes reach shared memory must not change a bit of O or LSE against the default (which
    test_hopper_matches_spec holds to the spec; pages past the end are zero-filled on every path):
    ``loads="bulk"`` (cp.async.bulk per key row, an mbarrier per stage, padded rows), ``loads="tma"``
    (tensor-map boxes per page, hardware swizzle) and the L2 hints; nor how sub-byte codes become e4m3
    tiles (``kv_convert="exact"`` against the default "scaled": the same products, so the same bits), nor when
    V's tile is converted with K in registers (``v_convert``: the same work in another order), nor the tile
    loop's schedule (``schedule``: "overlap", P.V of a tile between the barriers of the next tile's S, against
    "serial"; the NVFP4 row against the tile K path, which test_hopper_packed_k_paths_match_spec holds to the
    same bits)."""
    from mjolnir_kernel import decode

    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    if kw["plan"] is None:
        kw["plan"] = _plan(case)
    o, lse = decode(inputs.q, inputs.cache, **kw)
    o_var, lse_var = decode(inputs.q, inputs.cache, **kw, **options)
    torch.cuda.synchronize()
    assert not torch.isnan(o_var.float()).any(), f"{case.name}: NaN in O ({variant})"
    same = (o_var.view(torch.int16) == o.view(torch.int16)).float().mean().item()
    assert torch.equal(o_var.view(torch.int16), o.view(torch.int16)), f"{case.name} {variant}: {same:.2%} of O same"
    assert torch.equal(lse_var.view(torch.int32), lse.view(torch.int32)), f"{case.name} {variant}: LSE differs"


def test_hopper_empty_sequences_give_zero_and_minus_inf():
    case = next(c for c in KERNEL_CASES if c.name == "seq_len_0_padding")
    _, _, (o, lse), _ = _run_both(case)
    empty = [i for i, L in enumerate(case.seq_lens) if L == 0]
    o4 = o.view(len(case.seq_lens), case.q_len, case.heads_q, case.head_dim)
    assert (o4[empty] == 0).all()
    assert torch.isneginf(lse[empty]).all()


def test_hopper_padded_work_list_is_bit_identical():
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    kw.pop("plan")
    plan = _plan(case)
    padded = plan_split_kv(list(case.seq_lens), case.heads_k, sm_count=132, pad_to=plan.num_work + 37)
    o1, l1 = decode(inputs.q, inputs.cache, plan=plan, **kw)
    o2, l2 = decode(inputs.q, inputs.cache, plan=padded, **kw)
    assert padded.num_work == plan.num_work + 37
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)


def test_hopper_permuted_page_assignment_is_bit_identical():
    """Moving every page elsewhere in the pool (and the block table with it) changes no bit."""
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "varlen")
    inputs = case.build("cuda")
    cache = inputs.cache
    permuted = permute_pages(cache)
    kw = inputs.emulator_kwargs()
    kw["plan"] = _plan(case)
    o1, l1 = decode(inputs.q, cache, **kw)
    o2, l2 = decode(inputs.q, permuted, **kw)
    assert not torch.equal(permuted.block_table, cache.block_table)
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)


def test_hopper_q_and_o_inside_wider_rows():
    from mjolnir_kernel import decode

    case = next(c for c in CASES if c.name == "bf16_q")
    inputs = case.build("cuda")
    rows, h_q, d = inputs.q.shape
    width = (h_q + 2 * case.heads_k) * d
    qbuf = torch.zeros(rows, width, dtype=inputs.q.dtype, device="cuda")
    qv = qbuf[:, : h_q * d].view(rows, h_q, d)
    qv.copy_(inputs.q)
    obuf = torch.full((rows, width), float("nan"), dtype=torch.bfloat16, device="cuda")
    ov = obuf[:, : h_q * d].view(rows, h_q, d)
    kw = inputs.emulator_kwargs()
    kw["plan"] = _plan(case)
    o_ref, _ = decode(inputs.q, inputs.cache, **kw)
    o, _ = decode(qv, inputs.cache, out=ov, **kw)
    assert o.data_ptr() == ov.data_ptr()
    assert torch.equal(ov.view(torch.int16), o_ref.view(torch.int16))
    assert torch.isnan(obuf[:, h_q * d :].float()).all(), "wrote outside O's columns"


def test_hopper_pdl_gives_the_same_bits():
    """Programmatic dependent launch only moves the reduction grid's launch earlier (it waits on the decode
    grid): O and LSE are bit-identical to the plain launch, on a case that goes through the reduction."""
    case = next(c for c in CASES if c.name == "forced_splits")
    inputs, kw, (o1, l1), (o_ref, lse_ref) = _run_both(case)
    assert max(kw["plan"].n_splits) > 1, "the case must exercise the split reduction"
    inputs, kw, (o2, l2), _ = _run_both(case, pdl=True)
    assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)
    report = compare_outputs(o2.cpu(), l2.cpu(), o_ref.cpu(), lse_ref.cpu(), o_flip_atol=_flip_atol(inputs, case))
    assert report.ok, report.summary()


def _merge_plan(case: DecodeCase):
    """The plan decode() would make on the H200 (132 SMs, up to 32 chunks), ``force_splits`` honoured."""
    rows = case.q_len * (case.heads_q // case.heads_k)
    return plan_split_kv(
        list(case.seq_lens), case.heads_k, n_q_tiles=max(1, math.ceil(rows / Q_TILE)), sm_count=132,
        max_splits=32, force_splits=case.force_splits,
    )  # fmt: skip


# cases whose plan splits some sequence (the merge runs), plus 32 chunks over three query tiles
SPLIT_CASES = tuple(c for c in HOPPER_CASES if max(_merge_plan(c).n_splits) > 1) + (
    DecodeCase(
        "hopper_32_splits_three_q_tiles",
        (4096, 3, 0, 2600),
        q_len=3,
        heads_q=48,
        heads_k=4,
        force_splits=32,
        notes="n_q 36; 32 and 21 chunks, an empty sequence, a three-key one",
    ),  # fmt: skip
)


@pytest.mark.parametrize("mma", ["sync", "wgmma"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c.name)
def test_hopper_fused_merge_gives_the_reduction_kernels_bits(case, mma):
    """The fused merge (the last CTA of each split (sequence, KV head, query tile) merges it in the decode
    grid) gives the same O and LSE bits as the reduction grid, which test_hopper_matches_spec holds to
    the spec."""
    from mjolnir_kernel import decode

    if mma == "wgmma" and case.q_dtype != "e4m3":
        pytest.skip("wgmma needs e4m3 Q")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    kw["plan"] = _merge_plan(case)
    assert max(kw["plan"].n_splits) > 1
    o_k, lse_k = decode(inputs.q, inputs.cache, **kw, mma=mma, merge="kernel")
    o_f, lse_f = decode(inputs.q, inputs.cache, **kw, mma=mma, merge="fused")
    same = (o_f.view(torch.int16) == o_k.view(torch.int16)).float().mean().item()
    assert torch.equal(o_f.view(torch.int16), o_k.view(torch.int16)), f"{case.name}: {same:.2%} of O same"
    assert torch.equal(lse_f.view(torch.int32), lse_k.view(torch.int32)), f"{case.name}: LSE differs"


def test_hopper_fused_merge_counts_return_to_zero():
    """Each launch leaves the merge's arrival counts at zero, so launches and CUDA-graph replays of one
    prepared call repeat the same bits (a count left behind would make the wrong CTA merge, or none)."""
    from mjolnir_kernel.api import prepare

    case = next(c for c in SPLIT_CASES if c.name == "hopper_32_splits_three_q_tiles")
    inputs = case.build("cuda")
    kw = inputs.emulator_kwargs()
    kw["plan"] = _merge_plan(case)
    assert kw["plan"].n_splits == (32, 1, 1, 21)
    stream = torch.cuda.Stream()  # the prepared launch is bound to the stream current at prepare time
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prep = prepare(inputs.q, inputs.cache, merge="fused", **kw)
        counts = prep._keep["split_counters"]
        assert prep.config.fused_merge and counts.numel() == len(case.seq_lens) * case.heads_k * 3
        prep.launch()
        o1, l1 = (t.clone() for t in prep.outputs())
        stream.synchronize()
        assert int(counts.abs().sum()) == 0, "a launch left arrival counts behind"
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            prep.launch()
        for _ in range(3):
            prep._o4.fill_(float("nan"))
            prep._lse.fill_(float("nan"))
            graph.replay()
            o2, l2 = prep.outputs()
            assert torch.equal(o1.view(torch.int16), o2.view(torch.int16)) and torch.equal(l1, l2)
        stream.synchronize()
        assert int(counts.abs().sum()) == 0
