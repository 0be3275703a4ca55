"""The spec at the speed of the hardware: ``emulate_decode`` on the GPU against the Hopper kernel on the
same cache, side by side in one run (the lent H200), with the target's exact arithmetic models on (the
defaults: MMA, ex2 and log of the H200).

Per row: the kernel's time (``mjolnir_kernel.decode``, eager calls, median), the emulator's (median of
``--repeat`` calls after one warm-up call, which also compiles the fused MMA chains; the fastest and slowest
call beside it, since the emulator's host-bound time varies between calls and processes), their ratio against
the goal (25x), the emulator's peak extra GPU memory over the quantized cache's bytes
(``torch.cuda.max_memory_allocated`` during the call, less what was allocated before it), and whether
O and LSE of the two are identical in every bit (they must be: the emulator is the kernel's spec). Two
columns say whether the host or the GPU bounds the emulator: ``returned ms``, the median time until
``emulate_decode`` returned, before the device synchronisation, and ``syncs``, how many of one call's
operations made the host wait for the device (torch's sync debug mode). With few syncs, a returned time
close to the emulator's time means the host's launches are the limit, and a much shorter one means the GPU's
work is.

    python -m benchmarks.bench_emulator_gpu                  # the issue's rows and the memory row
    python -m benchmarks.bench_emulator_gpu --quick          # small shapes (a smoke run)
    python -m benchmarks.bench_emulator_gpu --rows b32_4k --repeat 1
    python -m benchmarks.bench_emulator_gpu --rows b32_32k_e4m3_e4m3q --repeat 5 --ab MJOLNIR_X

``--ab NAME`` compares two variants of the emulator within one process (the same row varies up to 2x between
processes, and 2-7 % between the calls of one): an experiment reads the environment variable ``NAME`` at each
call (``0``: without it, ``1``: with it; a variable nothing reads, or read only once per process, gives two
equal medians); after one untimed call of each, ``--repeat`` pairs of calls run, each pair in the other order
than the last, every call's bits checked against the kernel's, and the row's line is followed by both medians
and their ratio. ``--ab NAME1,NAME2`` sets several variables together (two experiments against neither).
``--arms "A=0,B=0;A=1,B=0;A=1,B=1"`` times any number of variants the same way (the arms in turn, the order
reversed every round), so that one warm-up serves several experiments: a line per arm, and its time over
the first arm's.

Exits non-zero when a row's bits differ, or a ratio or memory goal is missed on the issue's rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Optional

import torch

RATIO_GOAL = 25.0
MEMORY_GOAL = 4.0  # peak extra memory / quantized cache bytes (plus the fixed workspace, printed apart)

# name: (batch, keys, h_q, h_k, d, KV format, Q dtype)
ROWS = {
    "b32_32k_e4m3_e4m3q": (32, 32768, 32, 8, 128, "e4m3", "e4m3"),
    "b32_32k_e4m3_bf16q": (32, 32768, 32, 8, 128, "e4m3", "bf16"),
    "b1_128k_e4m3q": (1, 131072, 24, 4, 256, "e4m3", "e4m3"),
    "b1_128k_bf16q": (1, 131072, 24, 4, 256, "e4m3", "bf16"),
    "b32_4k_e4m3q": (32, 4096, 24, 4, 256, "e4m3", "e4m3"),
    "b32_4k_bf16q": (32, 4096, 24, 4, 256, "e4m3", "bf16"),
    "b32_32k_e2m1": (32, 32768, 32, 8, 128, "e2m1", "e4m3"),
    "b32_32k_nvfp4": (32, 32768, 32, 8, 128, "nvfp4", "e4m3"),
    "b32_128k_memory": (32, 131072, 32, 8, 128, "e4m3", "e4m3"),
}
QUICK = {
    "b4_4k_e4m3q": (4, 4096, 32, 8, 128, "e4m3", "e4m3"),
    "b4_4k_bf16q": (4, 4096, 24, 4, 256, "e4m3", "bf16"),
    "b4_4k_e2m1": (4, 4096, 32, 8, 128, "e2m1", "e4m3"),
    "b4_4k_nvfp4": (4, 4096, 32, 8, 128, "nvfp4", "e4m3"),
}
PAGE_SIZE = 64


def _ms(fn, repeat: int, returned: Optional[list] = None) -> tuple[float, list, object]:
    """``fn``'s wall time in ms over ``repeat`` calls, each between device synchronisations: (median, every
    call's time, the last output). ``returned``: a list that gets each call's time until ``fn`` returned,
    before the synchronisation (the host's share where the call itself waits for nothing)."""
    times, out = [], None
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
        if returned is not None:
            returned.append(1e3 * (t1 - t0))
    return statistics.median(times), times, out


def _syncs(fn) -> int:
    """How many operations of one ``fn()`` call made the host wait for the device (torch's sync debug mode:
    ``.item()``, ``nonzero``, copies to the host, ...)."""
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def _set_env(values: dict) -> None:
    """Each environment variable of ``values`` set to its value, or unset where the value is None."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def kept_graphs_note(n_arms: int) -> Optional[str]:
    """A note when ``n_arms`` variants of one row are more than the problems whose window graphs the emulator
    keeps per device (``emulator._REPLAYS_KEPT``): arms whose switches are in the graphs' key would then evict
    each other's graphs, and every call would capture its graphs again inside the timing."""
    from mjolnir_numerics.emulator import _REPLAYS_KEPT

    if n_arms <= _REPLAYS_KEPT:
        return None
    return (
        f"# note: {n_arms} arms, more than the {_REPLAYS_KEPT} problems whose window graphs the emulator keeps per "
        "device: arms with their own graphs evict each other's, and each call captures its graphs again"
    )


def _arms(fn, arms: list, repeat: int, same_as) -> tuple[list, bool, list]:
    """``fn()`` under each arm of ``arms`` (dicts of environment variables to set): one untimed call of each
    (each variant compiles its graphs), then ``repeat`` timed rounds, the arms in order in one round and in
    reverse in the next (no arm always runs after the same one). Returns each arm's median (ms), whether every
    output passed ``same_as``, and each arm's median of the time until ``fn`` returned (the host's share, as
    in :func:`_ms`). Every variable an arm sets is restored afterwards."""
    note = kept_graphs_note(len(arms))
    if note:
        print(note, file=sys.stderr, flush=True)
    keys = sorted({k for arm in arms for k in arm})
    before = {k: os.environ.get(k) for k in keys}
    times: list = [[] for _ in arms]
    returned: list = [[] for _ in arms]
    same = True
    try:
        for round_ in range(repeat + 1):  # round 0: untimed
            order = range(len(arms)) if round_ % 2 == 0 else reversed(range(len(arms)))
            for a in order:
                # a variable another arm sets, and this one does not, is as it was before
                _set_env({k: arms[a].get(k, before[k]) for k in keys})
                back: list = []
                t0 = time.perf_counter()
                _, t, out = _ms(fn, 1, back)
                same = same and same_as(out)
                if round_:
                    times[a] += t
                    returned[a] += back
                else:  # progress: an arm's first call compiles its variant's graphs (minutes on a fresh machine)
                    print(f"# arm {a + 1} of {len(arms)} warmed up in {time.perf_counter() - t0:.1f} s",
                          file=sys.stderr, flush=True)  # fmt: skip
    finally:
        _set_env(before)
    med = statistics.median
    return [med(t) for t in times], same, [med(r) for r in returned]


def _ab(fn, names: str, repeat: int, same_as) -> tuple[float, float, bool, tuple[float, float]]:
    """``fn()`` with the environment variables ``names`` (comma-separated: one or several, set together) all at
    ``0`` and all at ``1``, alternating (:func:`_arms` with two arms). Returns the two medians (ms), whether
    every output passed ``same_as``, and the two medians of the time until ``fn`` returned."""
    keys = names.split(",")
    (off, on), same, (off_back, on_back) = _arms(fn, [dict.fromkeys(keys, "0"), dict.fromkeys(keys, "1")], repeat,
                                                 same_as)  # fmt: skip
    return off, on, same, (off_back, on_back)


def parse_arms(spec: str) -> list:
    """``--arms`` ``"A=0,B=0;A=1,B=1;A=1,B=1,C=1"``: arms separated by ``;``, each a comma-separated list of
    ``NAME=VALUE`` (at least one). Raises ``ValueError`` naming the part that is not."""
    arms = []
    for part in spec.split(";"):
        arm = {}
        for item in part.split(","):
            name, eq, value = item.partition("=")
            if not eq or not name.isidentifier() or name in arm:
                raise ValueError(f"--arms: expected NAME=VALUE pairs, each name once per arm; got {item!r} in {part!r}")
            arm[name] = value
        arms.append(arm)
    if len(arms) < 2:
        raise ValueError(f"--arms: expected at least two arms separated by ';', got {spec!r}")
    return arms


def same_bits(out, want) -> bool:
    """Whether two ``(o, lse)`` outputs (bfloat16 O, float32 LSE) are identical in every bit (NaNs included)."""
    return torch.equal(out[0].view(torch.int16), want[0].view(torch.int16)) and torch.equal(
        out[1].view(torch.int32), want[1].view(torch.int32)
    )


def row_inputs(spec, gen) -> tuple:
    """A row's inputs on CUDA: ``(cache, q, kw, nbytes)``, the paged cache of ``spec``'s format (page size
    :data:`PAGE_SIZE`, shuffled pages, random codes), Q ``(b, h_q, d)`` bfloat16 or e4m3 (then ``kw`` holds its
    ``q_descale``), and the cache's bytes. ``spec``: a value of :data:`ROWS`; ``gen``: a CUDA generator."""
    from benchmarks.bench_hopper_decode import build_pools
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.formats import get_format
    from mjolnir_numerics.scales import quantize_q

    b, L, h_q, h_k, d, fmt, q_dtype = spec
    k_pool, v_pool, bt, lens, kd, vd, scales, nbytes = build_pools(b, L, h_k, d, fmt, PAGE_SIZE, gen)
    cache = PagedKVCache(
        get_format(fmt), PAGE_SIZE, "nhd", d, k_pool, v_pool, scales.get("k_scales"), scales.get("v_scales"), bt,
        lens, kd, vd,
    )  # fmt: skip
    q = torch.randn(b, h_q, d, generator=gen, device="cuda").to(torch.bfloat16)
    kw = {}
    if q_dtype == "e4m3":
        q, kw["q_descale"] = quantize_q(q, b, 1, h_k)
    return cache, q, kw, nbytes


def bench_row(name, spec, repeat: int, kernel_iters: int, gen, ab: Optional[str] = None, arms=None) -> dict:
    from mjolnir_kernel import decode
    from mjolnir_numerics.emulator import emulate_decode

    b, L, h_q, h_k, d, fmt, q_dtype = spec
    cache, q, kw, nbytes = row_inputs(spec, gen)
    decode(q, cache, **kw)  # compile and load the kernel
    kernel_ms, _, (o_k, lse_k) = _ms(lambda: decode(q, cache, **kw), kernel_iters)
    t0 = time.perf_counter()
    emulate_decode(q, cache, **kw)  # warm-up: compiles the fused chains of this shape
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    returned: list = []
    emu_ms, emu_times, (o_e, lse_e) = _ms(lambda: emulate_decode(q, cache, **kw), repeat, returned)
    extra = torch.cuda.max_memory_allocated() - base
    syncs = _syncs(lambda: emulate_decode(q, cache, **kw))

    def same_as_kernel(out) -> bool:
        return same_bits(out, (o_k, lse_k))

    same = same_as_kernel((o_e, lse_e))
    ab_ms = None
    if ab is not None:
        off_ms, on_ms, same_ab, (off_back, on_back) = _ab(
            lambda: emulate_decode(q, cache, **kw), ab, repeat, same_as_kernel
        )
        ab_ms, same = (off_ms, on_ms, off_back, on_back), same and same_ab
    arms_ms = None
    if arms is not None:
        medians, same_arms, backs = _arms(lambda: emulate_decode(q, cache, **kw), arms, repeat, same_as_kernel)
        arms_ms, same = list(zip(medians, backs)), same and same_arms
    row = dict(
        name=name, shape=f"b{b} {L // 1024}K {h_q}/{h_k} d{d}", fmt=fmt, q=q_dtype, kernel_ms=kernel_ms,
        emu_ms=emu_ms, emu_range=f"{min(emu_times):.1f}-{max(emu_times):.1f}", ratio=emu_ms / kernel_ms,
        warm_s=warm_s, extra_gb=extra / 1e9, cache_gb=nbytes / 1e9, mem_ratio=extra / nbytes, same=same,
        ab=ab_ms, arms=arms_ms, returned_ms=statistics.median(returned), syncs=syncs,
    )  # fmt: skip
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes (goals not checked)")
    ap.add_argument("--rows", default=None, help=f"comma-separated row names (default: all of {', '.join(ROWS)})")
    ap.add_argument("--repeat", type=int, default=3, help="timed emulator calls per row (median)")
    ap.add_argument("--kernel-iters", type=int, default=20, help="timed kernel calls per row (median)")
    ap.add_argument(
        "--ab", metavar="NAME[,NAME...]", default=None,
        help="also time --repeat calls each with the environment variables NAME all at 0 and all at 1, alternating",
    )  # fmt: skip
    ap.add_argument(
        "--arms", metavar="A=0,B=0;A=1,B=0;...", default=None,
        help="also time --repeat calls under each arm (';'-separated sets of environment variables), in turn",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_emulator_gpu: needs a CUDA GPU that runs the Hopper kernel", file=sys.stderr)
        return 2
    table = QUICK if args.quick else ROWS
    names = list(table) if args.rows is None else args.rows.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"--rows: unknown {', '.join(unknown)}; choose from {', '.join(table)}", file=sys.stderr)
        return 2
    if args.ab is not None and not all(k.isidentifier() for k in args.ab.split(",")):
        print(f"--ab: expected environment variables' names (letters, digits, _), comma-separated, got {args.ab!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    arms = None
    if args.arms is not None:
        if args.ab is not None:
            print("--ab and --arms: give one of them (--ab NAME is --arms NAME=0;NAME=1)", file=sys.stderr)
            return 2
        try:
            arms = parse_arms(args.arms)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
    if args.repeat < 1 or args.kernel_iters < 1:
        print("--repeat and --kernel-iters: expected >= 1", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; page size {PAGE_SIZE}, shuffled pages, "
          f"random codes; emulator: default (hardware) arithmetic; median of {args.repeat} emulator calls after "
          f"a warm-up, {args.kernel_iters} eager kernel calls")  # fmt: skip
    head = f"{'row':<20} {'shape':<20} {'KV':<6} {'Q':<5} {'kernel ms':>10} {'emulator ms':>12} {'calls ms':>13}"
    head += f" {'ratio':>7}"
    print(head + f" {'warm-up s':>9} {'extra GB':>9} {'cache GB':>9} {'extra/cache':>11} {'returned ms':>11}"
          f" {'syncs':>5}  bits")  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(0)
    bad = False
    for name in names:
        r = bench_row(name, table[name], args.repeat, args.kernel_iters, gen, args.ab, arms)
        torch.cuda.empty_cache()  # the row's cache is freed with its frame
        ratio_ok = r["ratio"] <= RATIO_GOAL or name.endswith("_memory")
        mem_ok = r["mem_ratio"] <= MEMORY_GOAL
        print(
            f"{name:<20} {r['shape']:<20} {r['fmt']:<6} {r['q']:<5} {r['kernel_ms']:>10.3f} {r['emu_ms']:>12.1f} "
            f"{r['emu_range']:>13} {r['ratio']:>6.1f}x {r['warm_s']:>9.1f} {r['extra_gb']:>9.2f} {r['cache_gb']:>9.2f} "
            f"{r['mem_ratio']:>10.2f}x {r['returned_ms']:>11.1f} {r['syncs']:>5}"
            f"  {'identical' if r['same'] else 'DIFFER'}"
            f"{'' if ratio_ok or args.quick else '  (ratio goal missed)'}"
            f"{'' if mem_ok or args.quick else '  (memory goal missed)'}",
            flush=True,
        )  # fmt: skip
        if r.get("ab") is not None:
            off, on, off_back, on_back = r["ab"]
            line = f"{'':<20} {args.ab}=0 {off:.1f} ms, {args.ab}=1 {on:.1f} ms (medians of {args.repeat} "
            line += f"alternating calls): 1/0 {on / off:.2f}, ratio at 1 {on / r['kernel_ms']:.1f}x; "
            print(line + f"returned {off_back:.1f} / {on_back:.1f} ms", flush=True)
        arms_ms = r.get("arms") or []
        for k, (ms, back) in enumerate(arms_ms):
            first = arms_ms[0][0]  # arm 1's median: the others are read against it
            label = ",".join(f"{n}={v}" for n, v in arms[k].items())
            print(f"{'':<20} arm {k + 1} {label}: {ms:.1f} ms (median of {args.repeat}, arms in turn), "
                  f"{ms / first:.2f} of arm 1, ratio {ms / r['kernel_ms']:.1f}x; returned {back:.1f} ms",
                  flush=True)  # fmt: skip
        bad |= not r["same"] or (not args.quick and not (ratio_ok and mem_ok))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
