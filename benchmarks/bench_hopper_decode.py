"""Hopper decode bandwidth, side by side in one run on an sm_90 GPU (the lent H200).

Decode is memory-bound, so every contender is reported as bytes of KV read per second and as a
fraction of a read-only stream measured in the same run (``torch.sum`` over an int64 tensor):

* ``mjolnir``   the Hopper kernel (``mjolnir_kernel.prepare(...).launch()``, default arguments), paged, shuffled
                pages; bytes = K + V as stored (plus NVFP4 block scales);
* ``sdpa``      ``torch.nn.functional.scaled_dot_product_attention`` on dense bf16 K/V (twice the bytes
                of e4m3), GQA through ``enable_gqa``; bytes = bf16 K + V;
* ``widen+sdpa`` an e4m3 cache widened to bf16, then SDPA: what a PyTorch user writes without a
                kernel; reported against the e4m3 bytes;
* ``flashinfer`` FlashInfer's fp8 paged decode (``BatchDecodeWithPagedKVCacheWrapper``, bf16 Q, e4m3
                K/V, per-tensor scales) on the very pools and block table ours reads, CUDA-graph safe
                buffers; its CUDA-core and tensor-core paths are both timed and the faster one is
                reported (when ``import flashinfer`` works: carry its wheel to the device).

The "x sdpa" column is SDPA's time over ours at equal work (same shape, same number of keys).

Each timed replay holds one call by default: its time includes a graph launch and the GPU going idle
and busy again (the "launch floor" line), which weighs on short calls. ``--back-to-back N`` captures
N calls per replay instead, as a serving loop's graph runs one layer after another, and reports the
time per call; every contender is timed the same way, and where one copy of the inputs would fit in L2
four times over, the calls cycle through enough distinct copies that the KV is read from DRAM (except
``widen+sdpa``, whose own widening dominates its time).

    python -m benchmarks.bench_hopper_decode                 # the issue's shapes, e4m3 + sub-byte formats
    python -m benchmarks.bench_hopper_decode --quick         # two shapes, e4m3 only
    python -m benchmarks.bench_hopper_decode --back-to-back 20   # steady state: 20 calls per replay
    python -m benchmarks.bench_hopper_decode --head-dims 256 --formats e2m1   # the d = 256 shape (24/4), e2m1 only
    python -m benchmarks.bench_hopper_decode --quick --plans occupancy,batch_invariant   # what invariance costs
    python -m benchmarks.bench_hopper_decode --l2-resident --seqlen 8192   # the kernel's own pace, KV in L2
    python -m benchmarks.bench_hopper_decode --back-to-back 20 --size-matched-stream --csv h.csv
        # + torch.sum and the fastest bare read of each row's bytes; every row to h.csv, which
        # benchmarks.plot_bandwidth draws and benchmarks.probes.fixed_cost fits (several --seqlen runs)
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

import torch

GiB = 1 << 30


DESCALE = 0.02  # per-tensor K and V descale of the benchmark pools (the codes span e4m3's whole range)
GRAPHS = True  # time CUDA-graph replays (what a serving loop runs); --eager times Python launches
BACK_TO_BACK = 1  # calls per timed replay (--back-to-back)
QUEUED = False  # --queued: no host sync between timed replays, so the GPU never idles between them


def _time_ms(fn, iters: int, warmup: int = 3, stream=None) -> float:
    """Median milliseconds per call of ``fn`` over ``iters`` CUDA-event-timed replays of a CUDA graph
    captured on ``stream`` (the stream ``fn`` launches on; Python launches if GRAPHS is False). A replay
    holds ``BACK_TO_BACK`` calls; ``fn`` may be a list of callables (the same call on distinct input
    copies), which the calls cycle through. The host waits for each replay before launching the next
    unless ``QUEUED`` (then the replays follow each other on the GPU with no idle gap)."""
    calls = list(fn) if isinstance(fn, (list, tuple)) else [fn]
    n = BACK_TO_BACK

    def body():
        for i in range(n):
            calls[i % len(calls)]()

    stream = stream or torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # inputs were made on the current stream
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            body()
    torch.cuda.synchronize()
    run = body
    if GRAPHS:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            body()
        run = graph.replay
    events = []
    with torch.cuda.stream(stream):
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            if not QUEUED:
                b.synchronize()  # the GPU idles until the next replay is launched
            events.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / n for a, b in events)


def input_copies(nbytes: float) -> int:
    """Distinct input copies a back-to-back replay cycles through: enough that the copies together are at
    least four times the L2 (so each call reads its KV from DRAM, not from the previous call's lines);
    1 for single-call replays."""
    if BACK_TO_BACK == 1:
        return 1
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, min(BACK_TO_BACK, math.ceil(4 * l2 / nbytes)))


def stream_tbps(gib: float = 4.0, iters: int = 20) -> float:
    """Read-only stream: torch.sum over an int64 tensor of ``gib`` GiB (one copy, far larger than four L2s),
    in TB/s."""
    return x_bytes_tb(gib * GiB, size_matched_read_ms(gib * GiB, iters))


def size_matched_read_ms(nbytes: float, iters: int) -> float:
    """Milliseconds of the read-only stream's own kernel (torch.sum over int64) reading ``nbytes``, timed
    as the decode rows are (graph replays; back to back it cycles through as many distinct copies as the
    KV does): what a bare read of the same bytes costs, launch and ramp included."""
    n = max(1, int(nbytes) // 8)
    copies = [torch.ones(n, dtype=torch.int64, device="cuda") for _ in range(input_copies(nbytes))]
    ms = _time_ms([c.sum for c in copies], iters)
    del copies
    torch.cuda.empty_cache()
    return ms


def launch_floor_us(iters: int = 20) -> float:
    """Microseconds per call of a one-element add timed the same way (graph replay between two events):
    what a kernel that reads nothing costs in this harness, for reading the short batch-1 rows. A
    reference, not a bound: with single-call replays on the lent H200 it read 10-21 us from run to run,
    and a one-tile decode (``--seqlen 128 --batches 1``) 11-17 us."""
    x = torch.zeros(1, device="cuda")
    return _time_ms(lambda: x.add_(1), iters) * 1e3


def x_bytes_tb(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e12


# --csv: one line per printed row. kind: mjolnir (the Hopper kernel), flashinfer, sdpa (dense bf16), widen
# (e4m3 widened, then SDPA), sum (torch.sum over the same bytes), read (the fastest bare read of them,
# benchmarks.probes.read_roofline; its configuration in read_config). label: the printed shape column (sweep tags).
CSV_FIELDS = ("kind", "batch", "heads_q", "heads_k", "head_dim", "label", "format", "q", "us", "bytes", "tbps",
              "stream_tbps", "pct_stream", "read_config", "plan")  # fmt: skip


def _row(kind, b, h_q, h_k, d, label, fmt, q, ms, nbytes, stream, read_config="", plan="") -> dict:
    tb = x_bytes_tb(nbytes, ms)
    return {"kind": kind, "batch": b, "heads_q": h_q, "heads_k": h_k, "head_dim": d, "label": label,
            "format": fmt, "q": q, "us": round(ms * 1e3, 2), "bytes": int(nbytes), "tbps": round(tb, 4),
            "stream_tbps": round(stream, 4), "pct_stream": round(100 * tb / stream, 2),
            "read_config": read_config, "plan": plan}  # fmt: skip


def write_csv(path: str, rows: list) -> None:
    """``rows`` (``_row`` dicts) to ``path`` with the header ``CSV_FIELDS``."""
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def random_codes(shape, fmt: str, gen: torch.Generator) -> torch.Tensor:
    """Random stored bytes of ``fmt`` (e4m3: no NaN codes) on the GPU."""
    raw = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen, device="cuda")
    if fmt == "e4m3":
        raw = torch.where((raw & 0x7F) == 0x7F, raw & 0xF0, raw)  # 0x7F / 0xFF are NaN
        return raw.view(torch.float8_e4m3fn)
    return raw


def build_pools(b, L, h_k, d, fmt, page_size, gen, layout="nhd", shared=False):
    """Paged pools, a shuffled block table, seq_lens, descales (and NVFP4 scales). ``layout`` "nhd":
    (pages, PS, h_k, row) storage; "hnd": (pages, h_k, PS, row) storage (a head's page is contiguous),
    both passed as the logical (pages, PS, h_k, row) view the kernel takes. ``shared``: every sequence's
    block-table row names the same pages (one sequence's worth of KV, read b times: small enough, it stays
    in L2); ``nbytes`` still counts the bytes the b sequences cover."""
    from mjolnir_numerics.formats import get_format

    bits = get_format(fmt).bits
    pages_per_seq = math.ceil(L / page_size)
    num_pages = (1 if shared else b) * pages_per_seq
    row = d * bits // 8
    if layout == "hnd":
        k_pool = random_codes((num_pages, h_k, page_size, row), fmt, gen).transpose(1, 2)
        v_pool = random_codes((num_pages, h_k, page_size, row), fmt, gen).transpose(1, 2)
    else:
        k_pool = random_codes((num_pages, page_size, h_k, row), fmt, gen)
        v_pool = random_codes((num_pages, page_size, h_k, row), fmt, gen)
    perm = torch.randperm(num_pages, generator=gen, device="cuda").to(torch.int32)
    block_table = perm.view(-1, pages_per_seq).expand(b, pages_per_seq).contiguous()
    seq_lens = torch.full((b,), L, dtype=torch.int32, device="cuda")
    k_descale = torch.full((h_k,), DESCALE, device="cuda")
    v_descale = torch.full((h_k,), DESCALE, device="cuda")
    scales = {}
    nbytes = 2 * b * L * h_k * row  # K + V bytes the sequences cover
    if fmt == "nvfp4":
        s = (torch.rand(num_pages, page_size, h_k, d // 16, generator=gen, device="cuda") * 2 + 0.25).to(
            torch.float8_e4m3fn
        )
        scales = {"k_scales": s, "v_scales": s.clone()}
        nbytes += 2 * b * L * h_k * (d // 16)
    return k_pool, v_pool, block_table, seq_lens, k_descale, v_descale, scales, nbytes


def bench_flashinfer(q, pools, block_table, L, h_q, h_k, d, page_size, o_ref, iters):
    """FlashInfer's fp8 paged decode on our pools (``pools``: (k, v, scales) copies, the first one's
    output checked against ``o_ref``): ``(ms, path, max |o - o_ours| / max |o_ours|)`` of the faster of
    its two paths (CUDA cores / tensor cores), or a string saying why it did not run."""
    try:
        import flashinfer
    except Exception as e:  # not carried, or it does not import on this machine
        return f"not run ({type(e).__name__}: {e})".splitlines()[0][:120]
    b, pages_per_seq = block_table.shape
    dev = q.device
    indptr = torch.arange(b + 1, dtype=torch.int32, device=dev) * pages_per_seq
    indices = block_table.flatten().contiguous()
    last = torch.full((b,), L - (pages_per_seq - 1) * page_size, dtype=torch.int32, device=dev)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)
    best = None
    for tensor_cores in (False, True):
        path = "tensor cores" if tensor_cores else "CUDA cores"
        try:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
                paged_kv_indptr_buffer=indptr.clone(), paged_kv_indices_buffer=indices.clone(),
                paged_kv_last_page_len_buffer=last.clone(),
            )  # fmt: skip
            wrapper.plan(
                indptr, indices, last, h_q, h_k, d, page_size, q_data_type=torch.bfloat16,
                kv_data_type=torch.float8_e4m3fn,
            )  # fmt: skip
            out = torch.empty_like(q)

            def run(kv, wrapper=wrapper, out=out):
                wrapper.run(q, kv, k_scale=DESCALE, v_scale=DESCALE, out=out)

            calls = [lambda kv=(kp, vp): run(kv) for kp, vp, _ in pools]
            ms = _time_ms(calls, iters)
            calls[0]()  # the output checked below is the first copy's
        except Exception as e:
            print(f"# flashinfer {path}: failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
            continue
        err = ((out.float() - o_ref.float()).abs().max() / o_ref.float().abs().max().clamp_min(1e-30)).item()
        print(f"# flashinfer {path}: {ms * 1e3:.1f} us, max |o - o_mjolnir| / max |o_mjolnir| = {err:.2e}")
        if best is None or ms < best[0]:
            best = (ms, path, err)
    return best if best is not None else "not run (both paths failed)"


def bench_shape(b, L, h_q, h_k, d, fmt, q_dtype, page_size, iters, gen, sdpa_cache, layout="nhd", pdl=False,
                peers=True, l2_resident=False, plans=("occupancy",)):  # fmt: skip
    """Time the Hopper kernel (``mjolnir_kernel.prepare`` with default arguments; ``pdl`` and the plan mode
    the only options) on paged pools of this shape, and its peers: ({plan mode: ms}, KV bytes, the SDPA
    timings, FlashInfer's result). Each mode in ``plans`` is timed on the same pools, one after another;
    the peers run once, checked against the last mode's output."""
    from dataclasses import replace

    from mjolnir_kernel import prepare
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.formats import get_format
    from mjolnir_numerics.scales import quantize_q

    k_pool, v_pool, bt, lens, kd, vd, scales, nbytes = build_pools(
        b, L, h_k, d, fmt, page_size, gen, layout, shared=l2_resident
    )
    pools = [(k_pool, v_pool, scales)]  # back-to-back replays of a small cache: distinct copies
    copies = 1 if l2_resident else input_copies(nbytes)
    extra = (build_pools(b, L, h_k, d, fmt, page_size, gen, layout) for _ in range(copies - 1))
    pools += [(c[0], c[1], c[6]) for c in extra]
    del extra
    q = torch.randn(b, h_q, d, generator=gen, device="cuda").to(torch.bfloat16)
    q_descale = None
    if q_dtype == "e4m3":
        q, q_descale = quantize_q(q, b, 1, h_k)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the pools are written on the current stream
    ms = {}
    for mode in plans:
        preps = []
        with torch.cuda.stream(stream):  # the prepared launch is bound to the current stream
            for kp, vp, sc in pools:
                cache = PagedKVCache(
                    get_format(fmt), page_size, layout, d, kp, vp, sc.get("k_scales"), sc.get("v_scales"), bt, lens,
                    kd, vd,
                )  # fmt: skip
                prep = prepare(q, cache, q_descale=q_descale, plan=mode)
                if pdl:
                    prep = prepare(q, cache, q_descale=q_descale, plan=mode, config=replace(prep.config, pdl=True))
                preps.append(prep)
        ms[mode] = _time_ms([p.launch for p in preps], iters, stream=stream)
    fi = None
    if peers and fmt == "e4m3" and q_dtype == "bf16" and layout == "nhd":
        torch.cuda.synchronize()
        fi = bench_flashinfer(q, pools, bt, L, h_q, h_k, d, page_size, preps[0].outputs()[0], iters)
    del k_pool, v_pool, pools, preps  # free the pools before the dense SDPA copies
    torch.cuda.empty_cache()

    key = (b, L, h_q, h_k, d)
    if key not in sdpa_cache:
        sdpa_cache[key] = bench_sdpa(b, L, h_q, h_k, d, iters, gen) if peers else (math.nan,) * 4
    return ms, nbytes, sdpa_cache[key], fi


def bench_sdpa(b, L, h_q, h_k, d, iters, gen):
    """(ms of bf16 SDPA, bf16 bytes, ms of e4m3 -> bf16 widening + SDPA, e4m3 bytes)."""
    import torch.nn.functional as F

    q = torch.randn(b, h_q, 1, d, generator=gen, device="cuda").to(torch.bfloat16)
    k8 = random_codes((b, h_k, L, d), "e4m3", gen)
    v8 = random_codes((b, h_k, L, d), "e4m3", gen)

    def dense_bf16_ms():
        k16, v16 = k8.to(torch.bfloat16), v8.to(torch.bfloat16)
        copies = [(k16, v16)]
        for i in range(input_copies(2 * 2 * k8.numel()) - 1):  # back-to-back: distinct (shifted) copies
            copies.append((k16.roll(i + 1, dims=2), v16.roll(i + 1, dims=2)))
        calls = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True) for k, v in copies]
        return _time_ms(calls, iters)

    def widen_ms():  # one copy even back to back: its own widening (bf16 writes) dominates the call
        def call():
            return F.scaled_dot_product_attention(q, k8.to(torch.bfloat16), v8.to(torch.bfloat16), enable_gqa=True)

        return _time_ms(call, max(3, iters // 4))

    ms_sdpa = dense_bf16_ms()
    torch.cuda.empty_cache()
    ms_widen = widen_ms()
    e4m3_bytes = 2 * k8.numel()
    return ms_sdpa, 2 * e4m3_bytes, ms_widen, e4m3_bytes


SHAPES = [  # (h_q, h_k, d)
    (32, 8, 128),
    (24, 4, 256),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="batch 1 and 32 at L = 32K, e4m3 only")
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument(
        "--head-dims",
        default="128,256",
        help="comma-separated head dims of the shapes to run: 128 (32/8 heads), 256 (24/4 heads)",
    )
    ap.add_argument("--formats", default="e4m3,e3m2,e2m3,e2m1,nvfp4")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--layout", default="nhd", choices=("nhd", "hnd"), help="KV pool storage order")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--eager", action="store_true", help="time Python launches instead of CUDA-graph replays")
    ap.add_argument("--pdl", action="store_true", help="programmatic dependent launch of both grids (HopperConfig.pdl)")
    ap.add_argument("--no-peers", action="store_true", help="time the Hopper kernel only (no SDPA, no FlashInfer)")
    ap.add_argument("--size-matched-stream", action="store_true",
                    help="after each format's rows, a 'sum' row (torch.sum over int64 reading the same bytes) and"
                    " a 'read' row (the fastest configuration of benchmarks.probes.read_roofline's bare read of them),"
                    " timed the same way, and the rows' speed as a fraction of each")  # fmt: skip
    ap.add_argument("--l2-resident", action="store_true",
                    help="every sequence reads the same pages (one sequence's KV, which stays in L2 at --seqlen"
                    " 8192): the rows time the kernel's own work per byte covered, not DRAM; %%stream may pass"
                    " 100%% (no peers)")  # fmt: skip
    ap.add_argument("--back-to-back", type=int, default=1, metavar="N",
                    help="calls per timed replay (1: single calls; N > 1: the steady state of N calls in a row,"
                    " cycling through input copies where one would fit in L2)")  # fmt: skip
    ap.add_argument(
        "--csv",
        metavar="PATH",
        help="also write every row to PATH as CSV (CSV_FIELDS; benchmarks.plot_bandwidth draws it)",
    )
    ap.add_argument(
        "--plans",
        default="occupancy",
        metavar="MODES",
        help="comma-separated plan modes of the Hopper kernel's rows, each timed on the same pools one"
        " after the other (occupancy, batch_invariant); the first is the reference of the ratios",
    )
    ap.add_argument("--queued", action="store_true",
                    help="queue the timed replays without a host sync between them (the GPU does not idle"
                    " between replays; each is still timed by its own pair of events)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.back_to_back < 1:
        ap.error(f"--back-to-back: expected a positive number of calls, got {args.back_to_back}")
    if args.csv and not os.path.isdir(os.path.dirname(os.path.abspath(args.csv))):
        ap.error(f"--csv {args.csv!r}: no such directory to write it in")
    if args.l2_resident and args.size_matched_stream:
        ap.error("--l2-resident: the size-matched read reads DRAM; pass one of --l2-resident, --size-matched-stream")
    if args.l2_resident:
        args.no_peers = True  # the peers would read b distinct sequences from DRAM: not the same work
    global GRAPHS, BACK_TO_BACK, QUEUED
    GRAPHS = not args.eager
    BACK_TO_BACK = args.back_to_back
    QUEUED = args.queued
    from mjolnir_numerics.plan import PLAN_MODES

    plans = tuple(x.strip() for x in args.plans.split(",") if x.strip())
    if not plans or any(m not in PLAN_MODES for m in plans) or len(set(plans)) != len(plans):
        ap.error(f"--plans {args.plans!r}: distinct comma-separated modes from {', '.join(PLAN_MODES)}")
    shape_dims = {d for *_, d in SHAPES}
    head_dims = [x.strip() for x in args.head_dims.split(",") if x.strip()]
    if not head_dims or any(not d.isdigit() or int(d) not in shape_dims for d in head_dims):
        ap.error(f"--head-dims {args.head_dims!r}: comma-separated values from {sorted(shape_dims)}")
    shapes = [s for s in SHAPES if str(s[2]) in head_dims]
    if not torch.cuda.is_available():
        print("bench_hopper_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks.probes.read_roofline import best_bare_read_ms, config_label
    from mjolnir_kernel.config import ConfigError
    from mjolnir_numerics.capability import KV_FORMATS

    batches = [1, 32] if args.quick else [int(x) for x in args.batches.split(",")]
    formats = ["e4m3"] if args.quick else [f for f in args.formats.split(",") if f]
    skipped = [f for f in formats if f not in KV_FORMATS]
    formats = [f for f in formats if f in KV_FORMATS]
    gen = torch.Generator(device="cuda").manual_seed(0)
    stream = stream_tbps()
    timing = "CUDA-graph replays" if GRAPHS else "eager launches"
    if BACK_TO_BACK > 1:
        timing += f" of {BACK_TO_BACK} calls in a row (time per call)"
    if QUEUED:
        timing += ", queued without a host sync between replays"
    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; L = {args.seqlen}, page size"
        f" {args.page_size}, {args.layout} pools; median of {args.iters} {timing}"
    )
    print(f"# read-only stream (torch.sum over 4 GiB int64): {stream:.2f} TB/s")
    if args.l2_resident:
        print("# --l2-resident: every sequence reads the same pages, held in L2: bytes covered per second")
    print(f"# launch floor (a one-element add, timed the same way): {launch_floor_us():.1f} us")
    if skipped:
        print(f"# not run (the Hopper kernel does not read them yet): {', '.join(skipped)}")
    head = f"{'shape':<22} {'format':<6} {'Q':<7} {'us':>9} {'TB/s':>6} {'%stream':>8} {'x sdpa':>7}"
    print(head)
    sdpa_cache = {}
    read_kernels = {}  # the bare-read kernels of --size-matched-stream, compiled once
    bare_reads = {}  # bytes -> (ms, config): formats of the same bytes (e3m2, e2m3) share one sweep
    this = sys.modules[__name__]  # timed with this module's BACK_TO_BACK, also when run as __main__
    rows = []
    fi_note = None
    for h_q, h_k, d in shapes:
        for b in batches:
            for fmt in formats:
                variants = ["bf16", "e4m3"] if fmt == "e4m3" else ["e4m3"]
                fmt_rows = []  # (label, ms, bytes) of this format's rows, for the size-matched read
                shape = f"b{b} {h_q}/{h_k} d{d}"
                for q_label in variants:
                    try:
                        ms_by_plan, nbytes, (ms_sdpa, b16, ms_widen, b8), fi = bench_shape(
                            b, args.seqlen, h_q, h_k, d, fmt, q_label, args.page_size, args.iters, gen,
                            sdpa_cache, args.layout, args.pdl, not args.no_peers, args.l2_resident, plans,
                        )  # fmt: skip
                    except ConfigError as e:
                        print(f"{shape:<22} {fmt:<6} {q_label:<7} not run: {e}")
                        continue
                    for mode, ms in ms_by_plan.items():
                        tb = x_bytes_tb(nbytes, ms)
                        tag = "" if len(plans) == 1 else f"  plan={mode}"
                        if mode != plans[0]:
                            tag += f" ({ms / ms_by_plan[plans[0]]:.3f}x the {plans[0]} plan's time)"
                        print(
                            f"{shape:<22} {fmt:<6} {q_label:<7} {ms * 1e3:>9.1f} {tb:>6.2f} {tb / stream:>8.1%}"
                            f" {ms_sdpa / ms:>6.2f}x{tag}"
                        )
                        rows.append(_row("mjolnir", b, h_q, h_k, d, shape, fmt, q_label, ms, nbytes, stream,
                                         plan=mode))  # fmt: skip
                    ms = ms_by_plan[plans[0]]
                    fmt_rows.append((q_label, ms, nbytes))
                    if isinstance(fi, str):
                        fi_note = f"# FlashInfer: {fi}"
                    elif fi is not None:
                        fi_ms, path, _ = fi
                        tb_f = x_bytes_tb(nbytes, fi_ms)
                        print(
                            f"{shape:<22} {fmt:<6} {'fi':<7} {fi_ms * 1e3:>9.1f} {tb_f:>6.2f} {tb_f / stream:>8.1%}"
                            f" {ms_sdpa / fi_ms:>6.2f}x  FlashInfer ({path}); mjolnir {fi_ms / ms:.2f}x faster"
                        )
                        rows.append(_row("flashinfer", b, h_q, h_k, d, shape, fmt, "fi", fi_ms, nbytes, stream))
                if args.size_matched_stream and fmt_rows:
                    nbytes = fmt_rows[0][2]
                    ms_r = size_matched_read_ms(nbytes, args.iters)
                    tb_r = x_bytes_tb(nbytes, ms_r)
                    shape = f"b{b} {h_q}/{h_k} d{d}"
                    print(f"{shape:<22} {'int64':<6} {'sum':<7} {ms_r * 1e3:>9.1f} {tb_r:>6.2f} {tb_r / stream:>8.1%}"
                          f"  torch.sum over the same {nbytes / 1e6:.0f} MB")  # fmt: skip
                    ratios = ", ".join(f"{label} {ms_r / ms:.0%}" for label, ms, _ in fmt_rows)
                    print(f"#   {fmt} rows at this size, as a fraction of that read's speed: {ratios}")
                    rows.append(_row("sum", b, h_q, h_k, d, shape, fmt, "sum", ms_r, nbytes, stream))
                    if nbytes not in bare_reads:
                        bare_reads[nbytes] = best_bare_read_ms(nbytes, args.iters, compiled=read_kernels, timing=this)
                    ms_b, config = bare_reads[nbytes]
                    tb_b = x_bytes_tb(nbytes, ms_b)
                    print(f"{shape:<22} {'bytes':<6} {'read':<7} {ms_b * 1e3:>9.1f} {tb_b:>6.2f} {tb_b / stream:>8.1%}"
                          f"  fastest bare read of the same bytes ({config_label(config)})")  # fmt: skip
                    ratios = ", ".join(f"{label} {ms_b / ms:.0%}" for label, ms, _ in fmt_rows)
                    print(f"#   {fmt} rows at this size, as a fraction of the fastest bare read: {ratios}")
                    rows.append(_row("read", b, h_q, h_k, d, shape, fmt, "read", ms_b, nbytes, stream,
                                     config_label(config)))  # fmt: skip
            if args.no_peers:
                continue
            ms_sdpa, b16, ms_widen, b8 = sdpa_cache[(b, args.seqlen, h_q, h_k, d)]
            shape = f"b{b} {h_q}/{h_k} d{d}"
            tb_s = x_bytes_tb(b16, ms_sdpa)
            print(f"{shape:<22} {'bf16':<6} {'sdpa':<7} {ms_sdpa * 1e3:>9.1f} {tb_s:>6.2f} {tb_s / stream:>8.1%}")
            rows.append(_row("sdpa", b, h_q, h_k, d, shape, "bf16", "bf16", ms_sdpa, b16, stream))
            tb_w = x_bytes_tb(b8, ms_widen)
            print(f"{shape:<22} {'e4m3':<6} {'widen':<7} {ms_widen * 1e3:>9.1f} {tb_w:>6.2f} {tb_w / stream:>8.1%}")
            rows.append(_row("widen", b, h_q, h_k, d, shape, "e4m3", "bf16", ms_widen, b8, stream))
    if fi_note is not None:
        print(fi_note)
    if args.csv:
        write_csv(args.csv, rows)
        print(f"# {len(rows)} rows written to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
