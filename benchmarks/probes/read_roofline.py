"""The fastest bare read of N bytes on this GPU, against torch.sum over the same bytes, side by side in one run.

The issue's 90 % target is a fraction of a read-only stream over a few GB (``torch.sum`` over int64). A
decode call reads fewer bytes (67 MB for e4m3 KV at batch 1 with 32K keys, 32/8 heads, d = 128), and a
read of that size pays the grid's ramp-up and drain, for every kernel. ``--size-matched-stream`` in
``benchmarks.bench_hopper_decode`` measures that for torch.sum's kernel; this benchmark asks whether any
kernel could read those bytes faster: ``benchmarks.probes.read_probe.ReadProbe`` does nothing but
read (16-byte loads, ``unroll`` in flight per thread), and a sweep over its CTA size, unroll, CTAs per SM
and access pattern finds the fastest configuration for each size. Timed exactly as the decode rows are
(CUDA-graph replays; ``--back-to-back N`` cycles through enough distinct copies that every call reads
DRAM). Per size it prints torch.sum and the best bare read (with its configuration), in us, TB/s and as a
fraction of the 4 GiB stream (``%stream``); ``--all`` prints every configuration of the sweep.

    python -m benchmarks.probes.read_roofline --back-to-back 20                 # the e4m3 decode sizes
    python -m benchmarks.probes.read_roofline --sizes-mb 67,268 --all --iters 10
"""

from __future__ import annotations

import argparse
import itertools
import sys

# The KV bytes of bench_hopper_decode's e4m3 rows at L = 32K: batch 1 / 8 / 32 (both head dims read the same).
DEFAULT_SIZES_MB = "67.1,536.9,2147.5"
THREADS = (256, 512)
UNROLLS = (4, 8)
CTAS_PER_SM = (1, 2, 4)


def sweep_configs(threads=THREADS, unrolls=UNROLLS, ctas_per_sm=CTAS_PER_SM, patterns=None):
    """Every (threads, unroll, ctas_per_sm, pattern) of the sweep (threads x CTAs per SM at most 2048, the
    H200's resident threads per SM)."""
    from benchmarks.probes.read_probe import READ_PATTERNS

    patterns = READ_PATTERNS if patterns is None else patterns
    return [(t, u, c, p) for t, u, c, p in itertools.product(threads, unrolls, ctas_per_sm, patterns) if t * c <= 2048]


def config_label(config) -> str:
    t, u, c, p = config
    return f"{p} {t}t x{u} {c}/SM"


def bare_read_ms(nbytes: int, iters: int, configs=None, compiled=None, timing=None) -> list[tuple[tuple, float]]:
    """``[(config, ms per call), ...]`` for every configuration (``sweep_configs()`` by default) reading
    ``nbytes`` (rounded down to 16-byte vectors), timed as ``bench_hopper_decode`` times its rows: with
    the ``_time_ms`` and ``input_copies`` of ``timing`` (that module, as imported, by default; a caller
    run as ``__main__`` passes itself, whose ``BACK_TO_BACK`` is the one it set). ``compiled``: a dict
    (threads, unroll, pattern) -> kernel, filled as needed, to compile each kernel once across sizes."""
    import torch

    from benchmarks.probes.read_probe import VECTOR_BYTES, compile_read_probe, read_launcher

    if timing is None:
        from benchmarks import bench_hopper_decode as timing

    configs = sweep_configs() if configs is None else configs
    compiled = {} if compiled is None else compiled
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}a"
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    n = max(1, int(nbytes) // VECTOR_BYTES) * VECTOR_BYTES
    copies = [torch.zeros(n, dtype=torch.uint8, device="cuda") for _ in range(timing.input_copies(n))]
    out = []
    for t, u, c, p in configs:
        key = (t, u, p)
        if key not in compiled:
            compiled[key] = compile_read_probe(t, u, p, arch)
        sink = torch.zeros(sms * c * t, dtype=torch.int32, device="cuda")
        calls = [read_launcher(compiled[key], x, sms * c, t, u, p, sink=sink) for x in copies]
        out.append(((t, u, c, p), timing._time_ms(calls, iters)))
    del copies
    torch.cuda.empty_cache()
    return out


def best_bare_read_ms(nbytes: int, iters: int, configs=None, compiled=None, timing=None) -> tuple[float, tuple]:
    """``(ms, config)`` of the fastest configuration of ``bare_read_ms``."""
    timed = bare_read_ms(nbytes, iters, configs, compiled, timing)
    config, ms = min(timed, key=lambda cm: cm[1])
    return ms, config


def parse_sizes_mb(text: str) -> list[int]:
    """``"67.1,536.9"`` -> byte counts (1 MB = 10^6 bytes). Raises ValueError naming the bad value."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        try:
            mb = float(part)
        except ValueError:
            raise ValueError(f"--sizes-mb: {part!r} is not a number (comma-separated MB, 1 MB = 10^6 bytes)") from None
        if not mb > 0:
            raise ValueError(f"--sizes-mb: {part!r}: expected a positive size in MB")
        sizes.append(round(mb * 1e6))
    return sizes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes-mb", default=DEFAULT_SIZES_MB, help="comma-separated read sizes in MB (10^6 bytes)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--back-to-back", type=int, default=1, metavar="N",
                    help="calls per timed replay, cycling through input copies where one would fit in L2")  # fmt: skip
    ap.add_argument("--all", action="store_true", help="print every configuration of the sweep, not only the best")
    args = ap.parse_args(argv)
    try:
        sizes = parse_sizes_mb(args.sizes_mb)
    except ValueError as e:
        ap.error(str(e))
    if args.back_to_back < 1:
        ap.error(f"--back-to-back: expected a positive number of calls, got {args.back_to_back}")
    import torch

    if not torch.cuda.is_available():
        print("read_roofline: needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks import bench_hopper_decode as bh

    bh.BACK_TO_BACK = args.back_to_back
    stream = bh.stream_tbps()
    timing = "CUDA-graph replays"
    if args.back_to_back > 1:
        timing += f" of {args.back_to_back} calls in a row (time per call)"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.iters} {timing}")
    print(f"# read-only stream (torch.sum over 4 GiB int64): {stream:.2f} TB/s")
    print(f"{'MB':>8} {'reader':<28} {'us':>9} {'TB/s':>6} {'%stream':>8}")
    compiled = {}
    for nbytes in sizes:
        mb = nbytes / 1e6
        ms_sum = bh.size_matched_read_ms(nbytes, args.iters)
        tb_sum = bh.x_bytes_tb(nbytes, ms_sum)
        print(f"{mb:>8.1f} {'torch.sum (int64)':<28} {ms_sum * 1e3:>9.1f} {tb_sum:>6.2f} {tb_sum / stream:>8.1%}")
        timed = bare_read_ms(nbytes, args.iters, compiled=compiled, timing=bh)
        if args.all:
            for config, ms in timed:
                tb = bh.x_bytes_tb(nbytes, ms)
                print(f"{mb:>8.1f} {config_label(config):<28} {ms * 1e3:>9.1f} {tb:>6.2f} {tb / stream:>8.1%}")
        config, ms = min(timed, key=lambda cm: cm[1])
        tb = bh.x_bytes_tb(nbytes, ms)
        label = "best: " + config_label(config)
        print(f"{mb:>8.1f} {label:<28} {ms * 1e3:>9.1f} {tb:>6.2f} {tb / stream:>8.1%}"
              f"  ({ms_sum / ms:.2f}x torch.sum)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
