"""Command line: ``python -m mjolnir_kernel compile ...`` (the compile gate) and ``... bench ...``.

compile: compiles the representative matrix (or ``--slice ci``) for ``--arch`` on any machine (no GPU
needed), prints config, compile time, registers, stack frame and spills (ptxas), and exits non-zero
on a compile error or when a config spills more than its entry in ``spill_baseline.json``. ``--arch
sm_90a`` builds the Hopper kernel's matrix (``compile.hopper_matrix``), a tcgen05 arch the Thor kernel's.
bench: checks the kernel against ``mjolnir_numerics.emulate_decode`` on the chosen problem, then
times it (median us, GB/s). Needs a tcgen05 GPU; ``--compile-only`` works anywhere, for the Hopper
kernel too (``--arch sm_90a``); ``--sass`` (compile only) also prints the decode kernel's loops and their
instruction mix from the machine code (``mjolnir_kernel.sass``: cuobjdump, no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mjolnir_numerics.capability import HEAD_DIMS, KV_FORMATS, PAGE_SIZES
from mjolnir_numerics.checks import OneLineArgumentParser, int_arg


def _arch_arg(value: str) -> str:
    """argparse type of ``--arch``: sm_90a (Hopper) or a tcgen05 arch; argparse names the argument."""
    from .compile import check_compile_arch

    try:
        return check_compile_arch(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count_arg(value: str) -> int:
    """argparse type of counts: an int >= 0 (argparse names the flag in its error)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {n}")
    return n


def _list_arg(allowed, convert=str):
    """argparse type of a comma-separated list whose items (after ``convert``) are each one of ``allowed``."""

    def parse(value: str) -> tuple:
        try:
            items = tuple(convert(v.strip()) for v in value.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated values, got {value!r}") from None
        bad = [v for v in items if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{bad[0]!r} is not one of {', '.join(map(str, allowed))}")
        return items

    return parse


def _compile_cmd(args) -> int:
    os.environ.setdefault("CUTE_DSL_ARCH", args.arch)  # the DSL's fallback; compile_decode passes --gpu-arch
    from .compile import (
        SPILL_BASELINE_PATH,
        baseline_entry,
        compile_decode,
        cutlass_available,
        cutlass_version,
        gate_configs,
        load_spill_baseline,
        spill_regressions,
    )

    reason = cutlass_available()
    if reason:
        print(f"compile: {reason}", file=sys.stderr)
        return 2
    configs = gate_configs(args.arch, args.slice)
    if args.filter:
        configs = [c for c in configs if all(f in c.short_name() for f in args.filter)]
    if args.limit:
        configs = configs[: args.limit]
    if not configs:
        print(f"compile: no {args.slice} {args.arch} config matches --filter {args.filter}", file=sys.stderr)
        return 2
    baseline_path = args.baseline or SPILL_BASELINE_PATH
    baseline = load_spill_baseline(baseline_path)
    print(f"# {len(configs)} configs for {args.arch}, nvidia-cutlass-dsl {cutlass_version()}, baseline {baseline_path}")
    header = (
        f"{'config':<52} {'time s':>7} {'regs':>5} {'stack':>6} {'spill st/ld':>12} {'red regs':>8} {'red spill':>9}"
    )
    print(header)
    print("-" * len(header))
    failures, regressions, entries = [], [], {}
    t_all = time.perf_counter()
    for cfg in configs:
        name = cfg.short_name()
        try:
            r = compile_decode(cfg, args.arch, smem_per_sm=args.smem_per_sm)
        except Exception as e:  # a compile error of any kind fails the gate
            msg = str(e).strip().splitlines()
            failures.append((name, f"{type(e).__name__}: {msg[0] if msg else ''}"))
            print(f"{name:<52} FAILED {type(e).__name__}: {msg[0] if msg else ''}", flush=True)
            continue
        dec = r.resources.get("decode")
        red = r.resources.get("reduction")
        if dec is None:
            failures.append((name, "no ptxas report for the decode kernel"))
        entries[name] = baseline_entry(r)
        regressions += spill_regressions(r, baseline)
        print(
            f"{name:<52} {r.seconds:7.1f} {dec.registers if dec else '?':>5} {dec.stack_frame if dec else '?':>6} "
            f"{(f'{dec.spill_stores}/{dec.spill_loads}' if dec else '?'):>12} "
            f"{red.registers if red else '-':>8} {(f'{red.spill_stores}/{red.spill_loads}' if red else '-'):>9}",
            flush=True,
        )
    print(f"# {len(configs) - len(failures)}/{len(configs)} compiled in {time.perf_counter() - t_all:.0f} s")
    # entries of configs the whole matrix no longer has (a renamed default, a dropped format): reported,
    # and dropped by a full, unfiltered --update-baseline
    whole = args.slice == "full" and not args.filter and not args.limit
    stale = sorted(set(baseline.get(args.arch, {})) - {c.short_name() for c in configs}) if whole else []
    if stale:
        print(f"# {len(stale)} {args.arch} baseline entries are not in the matrix, e.g. {stale[0]}")
    if args.update_baseline:
        merged = load_spill_baseline(baseline_path)
        merged.setdefault(args.arch, {}).update(entries)
        for name in stale if not failures else ():
            merged[args.arch].pop(name, None)
        merged[args.arch] = dict(sorted(merged[args.arch].items()))
        with open(baseline_path, "w") as f:
            json.dump(merged, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"# baseline for {args.arch} updated with {len(entries)} configs: {baseline_path}")
    for name, msg in failures:
        print(f"COMPILE ERROR {name}: {msg}", file=sys.stderr)
    if not args.update_baseline:
        for msg in regressions:
            print(f"SPILL REGRESSION {msg}", file=sys.stderr)
    return 1 if failures or (regressions and not args.update_baseline) else 0


def _bench_cmd(args) -> int:
    from mjolnir_numerics.targets import target_of_arch

    from .arch import tcgen05_device_reason
    from .bench import bench_config, run_bench
    from .config import ConfigError

    if args.compile_only or args.sass:
        os.environ.setdefault("CUTE_DSL_ARCH", args.arch)
        from .compile import compile_decode, cutlass_available

        reason = cutlass_available()
        if reason:
            print(f"bench: {reason}", file=sys.stderr)
            return 2
        try:
            cfg = bench_config(args, target_of_arch(args.arch))
        except (ConfigError, ValueError) as e:
            print(f"bench: {e}", file=sys.stderr)
            return 2
        r = compile_decode(cfg, args.arch, smem_per_sm=args.smem_per_sm)
        for kind, res in sorted(r.resources.items()):
            print(
                f"{cfg.short_name()} [{kind}] {args.arch}: {r.seconds:.1f} s, {res.registers} registers, "
                f"stack {res.stack_frame} B, spills {res.spill_stores}/{res.spill_loads} B"
            )
        if args.sass:
            from .sass import kernel_loops, sass_tools

            tool, reason = sass_tools()
            if tool is None:
                print(f"bench: --sass: {reason}", file=sys.stderr)
                return 2
            loops = kernel_loops(cfg, args.arch)
            name = f"{cfg.short_name()} [decode] {args.arch}"
            print(f"{name}: {len(loops)} innermost loops, largest first (static counts)")
            for lp in loops[: args.sass]:
                print("  " + lp.summary(top=16))
        return 0
    reason = tcgen05_device_reason()
    if reason is not None:
        print(
            f"bench: needs a tcgen05 GPU (compute capability 10.x or 11.x): {reason}; on a Hopper GPU run"
            " python -m benchmarks.bench_hopper_decode",
            file=sys.stderr,
        )
        return 2
    try:
        return run_bench(args)
    except (ConfigError, ValueError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2


def _conform_cmd(args) -> int:
    from .arch import decode_device_reason
    from .compile import cutlass_available

    reason = cutlass_available() or decode_device_reason()
    if reason:
        print(f"conform: needs a GPU a kernel runs on (9.0, 10.x, 11.x) and the CuTe DSL: {reason}", file=sys.stderr)
        return 2
    from mjolnir_numerics.cases import CASES

    from .conformance import KERNEL_CASES, conform_parallel, random_cases, select_cases

    named = () if args.no_named else select_cases(CASES + KERNEL_CASES, args.formats, args.head_dims)
    cases = named + random_cases(args.random, args.seed, args.max_keys, args.formats, args.head_dims)
    if not cases:
        print("conform: no case to run (--no-named with --random 0, or no named case of --formats / --head-dims)",
              file=sys.stderr)  # fmt: skip
        return 2
    print(f"# {len(cases)} cases ({len(named)} named), {args.jobs} process(es); a line per case as it finishes",
          flush=True)  # fmt: skip
    rows = conform_parallel(cases, args.jobs, on_row=lambda row: print(row.line(), flush=True))
    exact = sum(r.o_identical == 1.0 and r.lse_identical == 1.0 for r in rows)
    failed = [r.case for r in rows if not r.report.ok]
    print(f"# {len(rows)} cases: {exact} bit-identical in every O and LSE bit; {len(rows) - len(failed)} within the"
          f" named tolerances (mjolnir_kernel.conformance); {len(failed)} failed")  # fmt: skip
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog="python -m mjolnir_kernel", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("compile", help="compile the representative config matrix (no GPU needed)")
    c.add_argument(
        "--arch",
        default="sm_110a",
        type=_arch_arg,
        help="target: sm_90a (the Hopper kernel's matrix) or a tcgen05 one, e.g. sm_110a (Thor), sm_100a (B200)",
    )
    c.add_argument("--slice", choices=("full", "ci"), default="full", help="full matrix or the CI slice")
    c.add_argument("--filter", action="append", default=[], help="keep configs whose name contains this (repeatable)")
    c.add_argument("--limit", type=_count_arg, default=0, help="compile at most this many configs (0: all)")
    c.add_argument("--smem-per-sm", type=int_arg(1), default=None, help="shared memory per SM to assume (bytes)")
    c.add_argument("--baseline", default=None, help="spill baseline JSON (default: the checked-in one)")
    c.add_argument("--update-baseline", action="store_true", help="record these results in the baseline")

    f = sub.add_parser("conform", help="this GPU's kernel against the spec on named and random cases")
    f.add_argument("--random", type=_count_arg, default=20, help="random cases besides the named ones (default 20)")
    f.add_argument("--seed", type=_count_arg, default=0, help="seed of the random cases")
    f.add_argument("--max-keys", type=int_arg(1), default=65536, help="the longest random sequence")
    f.add_argument("--no-named", action="store_true", help="only the random cases")
    f.add_argument("--jobs", type=int_arg(1, 256), default=1, help="processes sharing the GPU (compiles run on CPUs)")
    f.add_argument(
        "--formats", type=_list_arg(KV_FORMATS), default=None, help="only these KV formats (comma-separated)"
    )
    f.add_argument(
        "--head-dims", type=_list_arg(HEAD_DIMS, int), default=None, help="only these head dims (comma-separated)"
    )

    b = sub.add_parser("bench", help="check against the spec, then time the kernel")
    b.add_argument("--batch", "--num-seqs", dest="batch", type=int_arg(1), default=1)
    b.add_argument("--seqlen", type=int_arg(1), default=1024, help="(max) keys per sequence, new tokens included")
    b.add_argument("--varlen", action="store_true", help="random lengths in [q_len, seqlen]")
    b.add_argument("--q-len", type=int_arg(1), default=1)
    b.add_argument("--heads-q", type=int_arg(1), default=24)
    b.add_argument("--heads-k", type=int_arg(1), default=4)
    b.add_argument("--head-dim", type=int, default=256, choices=HEAD_DIMS)
    b.add_argument("--page-size", type=int, default=128, choices=PAGE_SIZES)
    b.add_argument("--ctas-per-sm", type=int, default=None, choices=(1, 2),
                   help="Thor kernel only: co-resident CTAs per SM (default: the target's, 2)")  # fmt: skip
    b.add_argument("--ring-stages", type=int_arg(0), default=0,
                   help="Thor kernel only: KV ring stages of 16 KiB (0 = the default)")  # fmt: skip
    b.add_argument("--splits", type=int_arg(0), default=0, help="force N chunks per sequence (0 = occupancy plan)")
    b.add_argument("--max-splits", type=int_arg(1), default=None, help="partial slots per sequence (default: target's)")
    b.add_argument("--pad-work-to", type=int_arg(0), default=0, help="pad the work list (fixed grid, CUDA graphs)")
    b.add_argument("--layout", default="nhd", choices=("nhd", "hnd", "interleaved", "flashinfer"))
    b.add_argument("--format", default="e4m3", choices=("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4"))
    b.add_argument("--q-dtype", default=None, choices=("bf16", "e4m3"), help="default: bf16 for e4m3 KV, else e4m3")
    b.add_argument("--descale", default="per_tensor", choices=("per_tensor", "per_head", "per_seq_head"))
    b.add_argument("--pdl", action="store_true")
    b.add_argument("--non-causal", action="store_true")
    b.add_argument("--strided-qo", action="store_true", help="Q/O rows inside wider rows (fused QKV)")
    b.add_argument("--warmup", type=int_arg(0), default=3)
    b.add_argument("--iterations", type=int_arg(1), default=20)
    b.add_argument("--no-cold-l2", action="store_true", help="do not flush L2 between timed launches")
    b.add_argument("--seed", type=int_arg(0), default=0)
    b.add_argument("--skip-check", action="store_true", help="skip the check against emulate_decode")
    b.add_argument("--compile-only", action="store_true", help="only compile this config (works anywhere)")
    b.add_argument(
        "--sass", type=int_arg(0), nargs="?", const=3, default=0, metavar="N",
        help="compile only; print the decode kernel's N largest innermost loops (default 3) and their instruction mix",
    )  # fmt: skip
    b.add_argument("--arch", default="sm_110a", type=_arch_arg, help="--compile-only target (sm_90a: Hopper kernel)")
    b.add_argument("--smem-per-sm", type=int_arg(1), default=None)
    return p


def _check_args(parser, args) -> None:
    """Cross-flag checks, before any work (and before looking for a GPU): one line, exit 2."""
    if args.cmd == "bench":
        if args.heads_q % args.heads_k:
            parser.error(f"--heads-q: {args.heads_q} is not a multiple of --heads-k {args.heads_k}")
        if args.q_len > args.seqlen:
            parser.error(f"--q-len: {args.q_len} exceeds --seqlen {args.seqlen}")
    if args.cmd == "compile":
        if args.baseline is not None:
            path = args.baseline
            if os.path.exists(path):
                try:
                    with open(path) as fh:
                        json.load(fh)
                except (OSError, ValueError) as e:
                    parser.error(f"--baseline: {path} is not a readable JSON file ({type(e).__name__})")
            elif not args.update_baseline:
                parser.error(f"--baseline: {path} does not exist")
        if args.update_baseline:
            from .compile import SPILL_BASELINE_PATH

            folder = os.path.dirname(os.path.abspath(args.baseline or SPILL_BASELINE_PATH))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                parser.error(f"--update-baseline: cannot write into {folder}")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if args.cmd == "compile":
        return _compile_cmd(args)
    if args.cmd == "conform":
        return _conform_cmd(args)
    return _bench_cmd(args)


if __name__ == "__main__":
    sys.exit(main())
