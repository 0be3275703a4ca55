"""Probe (issue 24): the emulator's fused MMA chains on the GPU, and where one ``emulate_decode`` call spends
its time.

1. The chains of one window of b32 x 32K (32/8, d = 128, e4m3 KV and Q: 25 tiles of 32 chunks for S, one
   tile for P.V) as CUDA compiles them: the packed 32-bit formula (``arithmetic._int_chain``, with the
   packing of its operands) and, where this tree still has it, the float64 formula it replaced
   (``arithmetic._chain_formula``), side by side, bits compared.
2. ``--profile``: one emulator call on a row of ``bench_emulator_gpu`` under the torch profiler: the wall
   time, the CUDA kernels by total time, and the host's launches.
3. ``--arms``: variants of the emulator (environment variables, as ``bench_emulator_gpu --arms``) timed in turn
   on one row, every call's bits compared with the first arm's; without the Hopper kernel, so the CuTe DSL
   need not be installed.

    python -m benchmarks.probes.emulator_chain [--profile b32_32k_e4m3_e4m3q [--trace call.json.gz]]
    python -m benchmarks.probes.emulator_chain --no-chains --arms "X=0;X=1" --arms-row b32_32k_e2m1 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _time(fn, iters=5):
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out)


def chains(gen, which=("S", "PV"), float64=True) -> None:
    from benchmarks.bench_hopper_decode import random_codes
    from mjolnir_numerics import arithmetic as ar

    model = ar.MMA_MODELS["sm90_f16"]
    emin = ar.OPERAND_FORMATS[model.operand][1]
    old = getattr(ar, "_chain_formula", None) if float64 else None
    # name: a (rows), b (columns), c
    shapes = {
        "S, 25 tiles x 32 chunks": ((800, 8, 4, 128), (800, 8, 128, 128)),
        "P.V, one tile x 32 chunks": ((32, 8, 4, 128), (32, 8, 128, 128)),
    }
    shapes = {k: v for k, v in shapes.items() if k.replace(".", "").startswith(which)}
    print(f"{'chain':<28} {'products':>10} {'int32 ms':>9} {'G prod/s':>9} {'float64 ms':>11} {'ratio':>6}  bits")
    for name, (sa, sb) in shapes.items():
        a = random_codes(sa, "e4m3", gen)
        b = random_codes(sb, "e4m3", gen)
        steps = sa[-1] // 16
        c = torch.zeros(sa[:-1] + (sb[-2],), dtype=torch.float32, device="cuda")

        def new(a=a, b=b, c=c, steps=steps):
            pa, pb = ar.pack_fused(a, model.operand), ar.pack_fused(b, model.operand)
            pa, pb = pa.unflatten(-1, (steps, 16)), pb.unflatten(-1, (steps, 16))
            return ar._fused(ar._int_chain, True)(pa, pb, c, model.name)

        products = a.numel() // sa[-2] * sb[-2] * sa[-2]
        t_new = _time(new)
        got = new()
        line = f"{name:<28} {products:>10.3g} {t_new:>9.2f} {products / t_new / 1e6:>9.0f}"
        if old is not None:
            af, bf = a.float().unflatten(-1, (steps, 16)), b.float().unflatten(-1, (steps, 16))

            def before(af=af, bf=bf, c=c):
                return ar._fused(old, True)(af, bf, c, model.extra_bits, model.min_exponent, emin)

            t_old = _time(before)
            want = before()
            same = torch.equal(got.view(torch.int32), want.view(torch.int32))
            line += f" {t_old:>11.2f} {t_old / t_new:>5.1f}x  {'identical' if same else 'DIFFER'}"
        print(line, flush=True)


def arms_without_kernel(row: str, spec: str, repeat: int, gen) -> None:
    """``bench_emulator_gpu --arms`` without the Hopper kernel (no CuTe DSL needed): the arms of ``spec`` in turn,
    ``repeat`` rounds after one untimed call each, every call's O and LSE bits compared with the first arm's
    first call."""
    from benchmarks.bench_emulator_gpu import ROWS, _arms, parse_arms, row_inputs, same_bits
    from mjolnir_numerics.emulator import emulate_decode

    arms = parse_arms(spec)
    cache, q, kw, _ = row_inputs(ROWS[row], gen)
    want = []

    def same_as(out) -> bool:
        if not want:
            want.append(out)
        return same_bits(out, want[0])

    times, same, returned = _arms(lambda: emulate_decode(q, cache, **kw), arms, repeat, same_as)
    print(f"{row}: arms, medians of {repeat} calls each (bits {'identical' if same else 'DIFFER'} across arms)")
    for arm, t, r in zip(arms, times, returned):
        label = ",".join(f"{k}={v}" for k, v in arm.items())
        print(f"  {label:<60} {t:>7.1f} ms  {t / times[0]:>5.2f}x  returned {r:.1f} ms", flush=True)


def profile(row: str, gen, trace=None) -> None:
    from benchmarks.bench_emulator_gpu import ROWS, row_inputs
    from mjolnir_numerics.emulator import emulate_decode

    cache, q, kw, _ = row_inputs(ROWS[row], gen)
    t0 = time.perf_counter()
    emulate_decode(q, cache, **kw)
    torch.cuda.synchronize()
    print(f"\n{row}: warm-up call {time.perf_counter() - t0:.1f} s")
    print(f"{row}: emulator {_time(lambda: emulate_decode(q, cache, **kw), 2):.1f} ms (median of 2)")
    from torch.profiler import ProfilerActivity, profile as prof

    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        emulate_decode(q, cache, **kw)
        torch.cuda.synchronize()
    events = p.key_averages()
    print(events.table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    print(f"kernel launches: {launches}")
    if trace:
        p.export_chrome_trace(trace)
        print(f"trace: {trace}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=None, help="a bench_emulator_gpu row to profile")
    ap.add_argument("--trace", default=None, help="with --profile: the Chrome trace of the profiled call (.json.gz)")
    ap.add_argument("--no-chains", action="store_true")
    ap.add_argument("--chains", default="S,PV", help="which chains to time: S, PV or both")
    ap.add_argument("--no-float64", action="store_true", help="skip the float64 formula")
    ap.add_argument("--arms", default=None, help="A=0,B=0;A=1,B=0;...: time the emulator's variants (no kernel)")
    ap.add_argument("--arms-row", default="b32_32k_e4m3_e4m3q", help="with --arms: the bench_emulator_gpu row")
    ap.add_argument("--repeat", type=int, default=3, help="with --arms: timed rounds")
    args = ap.parse_args(argv)
    if args.arms is not None:
        from benchmarks.bench_emulator_gpu import ROWS, parse_arms

        try:
            parse_arms(args.arms)
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        if args.arms_row not in ROWS:
            print(f"--arms-row: unknown {args.arms_row!r}; choose from {', '.join(ROWS)}", file=sys.stderr)
            return 2
        if args.repeat < 1:
            print(f"--repeat: expected >= 1, got {args.repeat}", file=sys.stderr)
            return 2
    if not torch.cuda.is_available():
        print("emulator_chain: needs a CUDA GPU", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    if args.arms:
        arms_without_kernel(args.arms_row, args.arms, args.repeat, gen)
    if not args.no_chains:
        chains(gen, tuple(args.chains.split(",")), not args.no_float64)
    if args.profile:
        profile(args.profile, gen, args.trace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
