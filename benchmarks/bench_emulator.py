"""Speed and memory of the decode emulator against the seed's ``emulate_decode``, side by side.

Shapes (issue 3): b=32, L=4096, h_q=24, h_k=4, d=256, e4m3 KV, with bf16 Q and with e4m3 Q (target:
at least 4x faster than the seed on the same inputs), and b=1, L=131072 (target: under 1 s), and
peak memory at most 3x the float32 size of the KV being read. Exits non-zero when a target is missed.
The targets are checked on the ideal arithmetic (``EmulatorKnobs(mma="ideal", log="correctly_rounded",
ex2="correctly_rounded")``, the arithmetic they were set for); the last columns time the default, the
target's hardware models (Thor's on the CPU: MMA and log), the H200's (MMA, ex2 table, log), and the ratio
of the H200 run to the same without its ex2 table ("ex2 table"), in the same run: what the exact models cost.

Usage, from the repository root:
``python -m benchmarks.bench_emulator [--device cpu|cuda] [--quick] [--no-seed] [--no-hardware]``
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from typing import Optional

import torch

from benchmarks.seed import SEED_PATH, load_seed
from mjolnir_numerics.cache import PagedKVCache
from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_numerics.plan import default_plan
from mjolnir_numerics.formats import E4M3
from mjolnir_numerics.scales import pack_q, quantize_q

# Targets (issue 3)
SPEEDUP_TARGET = 4.0
LONG_SECONDS_TARGET = 1.0
PEAK_MEMORY_RATIO_TARGET = 3.0


def load_seed_emulator():
    """The seed's ``emulate_decode`` (fp32 torch ops on float pools), from :mod:`benchmarks.seed`."""
    return load_seed("emulate_decode", "FP8_P_SCALE", "log2_e", "tile_s_rows").emulate_decode


def random_e4m3_cache(num_seqs: int, seq_len: int, heads_k: int, d: int, page_size: int, device, seed: int = 0):
    """A paged e4m3 cache of random finite codes (shuffled pages), built directly from bytes."""
    gen = torch.Generator().manual_seed(seed)
    blocks = math.ceil(seq_len / page_size)
    num_pages = num_seqs * blocks + 2
    pools = []
    for _ in range(2):
        codes = torch.randint(0, 0x7E, (num_pages, page_size, heads_k, d), generator=gen, dtype=torch.uint8)
        sign = torch.randint(0, 2, codes.shape, generator=gen, dtype=torch.uint8) << 7
        # keep magnitudes moderate: codes 0x20..0x5F (values 2^-5 .. 2^4)
        codes = (codes % 0x40 + 0x20) | sign
        pools.append(codes.view(torch.float8_e4m3fn).to(device))
    perm = torch.randperm(num_pages, generator=gen)[: num_seqs * blocks].to(torch.int32)
    return PagedKVCache(
        fmt=E4M3,
        page_size=page_size,
        layout="nhd",
        head_dim=d,
        k_pool=pools[0],
        v_pool=pools[1],
        k_scales=None,
        v_scales=None,
        block_table=perm.view(num_seqs, blocks).to(device),
        seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=device),
        k_descale=(torch.rand(num_seqs, heads_k, generator=gen) + 0.5).to(device),
        v_descale=(torch.rand(num_seqs, heads_k, generator=gen) + 0.5).to(device),
    )


class PeakRSS:
    """Peak resident memory (CPU, sampled) or CUDA peak allocation during a block."""

    def __init__(self, device):
        self.device = torch.device(device)

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self._rss()
        self.peak = self.base
        self._stop = False
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _poll(self):
        while not self._stop:
            self.peak = max(self.peak, self._rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.extra = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop = True
            self._thread.join()
            self.peak = max(self.peak, self._rss())
            self.extra = self.peak - self.base
        return False


def timed(fn, device, cpu_times: Optional[list] = None):
    """``(fn(), wall seconds)``; appends the process CPU seconds to ``cpu_times`` when given (on a
    shared machine CPU time is the steadier measure of the work; wall time includes waiting)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    if cpu_times is not None:
        cpu_times.append(time.process_time() - c)
    return out, time.perf_counter() - t


def bench_case(name, num_seqs, seq_len, q_path, device, seed_fn, heads_q=24, heads_k=4, d=256, page_size=128,
               hardware=True):  # fmt: skip
    cache = random_e4m3_cache(num_seqs, seq_len, heads_k, d, page_size, device)
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(num_seqs, heads_q, d, generator=gen).to(torch.bfloat16).to(device)
    kwargs = {}
    if q_path == "e4m3":
        q, qd = quantize_q(q, num_seqs, 1, heads_k)
        kwargs["q_descale"] = qd
    kv_fp32_bytes = 2 * num_seqs * seq_len * heads_k * d * 4
    if torch.device(device).type == "cuda":  # a small untimed call first: CUDA / cuBLAS start-up is not the emulator
        small = random_e4m3_cache(1, 256, heads_k, d, page_size, device)
        emulate_decode(q[:1], small, **{k: v[:1] for k, v in kwargs.items()})
    cpu = []
    ideal = EmulatorKnobs(mma="ideal", log="correctly_rounded", ex2="correctly_rounded")
    with PeakRSS(device) as mem:
        (o, lse), ours = timed(lambda: emulate_decode(q, cache, **kwargs, knobs=ideal), device, cpu)
    row = {"case": name, "ours_s": ours, "ours_cpu_s": cpu[-1], "peak_ratio": mem.extra / kv_fp32_bytes}
    if hardware:  # the default: the target's (Thor's on the CPU) MMA and log models; then the H200's
        _, row["hw_s"] = timed(lambda: emulate_decode(q, cache, **kwargs), device)
        _, row["h200_s"] = timed(lambda: emulate_decode(q, cache, **kwargs, target="h200"), device)
        cr_ex2 = EmulatorKnobs(ex2="correctly_rounded")  # the H200's MMA and log, without its ex2 table
        _, row["h200_cr_ex2_s"] = timed(lambda: emulate_decode(q, cache, **kwargs, target="h200", knobs=cr_ex2), device)
    if seed_fn is not None:
        plan = default_plan(cache.seq_lens.cpu(), heads_k, heads_q // heads_k, target="thor", head_dim=d)
        plan_chunk = plan.chunk_tiles
        pages = torch.arange(cache.num_pages, device=device)
        (kp, vp), decode_s = timed(
            lambda: (cache.page_values("k", pages).cpu(), cache.page_values("v", pages).cpu()), device
        )
        row["seed_decode_s"] = decode_s  # what a seed user pays first: the cache's pools as float32
        qp = pack_q(q.cpu(), num_seqs, 1, heads_k).float()
        qd = kwargs.get("q_descale", torch.ones(num_seqs, heads_k)).cpu().float()
        qd = qd.expand(num_seqs, heads_k) if qd.dim() < 2 else qd
        args = (
            qp,
            kp,
            vp,
            cache.block_table.cpu(),
            cache.seq_lens.cpu(),
            qd,
            cache.descale_table("k").cpu(),
            cache.descale_table("v").cpu(),
            1.0 / math.sqrt(d),
            1.0,
            1,
            plan_chunk,
            q_path == "e4m3",
        )
        _, seed_s = timed(lambda: seed_fn(*args), "cpu", cpu)
        row["seed_s"] = seed_s
        row["seed_cpu_s"] = cpu[-1]
        row["speedup"] = seed_s / ours
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run; targets not checked)")
    ap.add_argument("--no-seed", action="store_true", help="skip the seed timing")
    ap.add_argument("--no-hardware", action="store_true", help="skip the hardware-arithmetic timing")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads for both emulators (default 1: on a shared 2-core machine, "
        "OpenMP synchronisation makes every small op ~20x slower with 2 threads)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"device {args.device}, torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    seed_fn = None if args.no_seed or not SEED_PATH.exists() else load_seed_emulator()
    hw = not args.no_hardware
    big = (32, 4096) if not args.quick else (4, 1024)
    long = (1, 131072) if not args.quick else (1, 16384)
    rows = [
        bench_case(f"b={big[0]} L={big[1]} bf16 Q", *big, "bf16", args.device, seed_fn, hardware=hw),
        bench_case(f"b={big[0]} L={big[1]} e4m3 Q", *big, "e4m3", args.device, seed_fn, hardware=hw),
        bench_case(f"b={long[0]} L={long[1]} e4m3 Q", *long, "e4m3", args.device, seed_fn, hardware=hw),
    ]
    print(
        f"{'case':<28}{'seed s':>9}{'+decode':>9}{'ours s':>9}{'ratio':>8}{'ratio+dec':>10}{'peak/KVfp32':>13}"
        f"{'seed cpu':>10}{'ours cpu':>10}{'cpu ratio':>10}{'hw arith s':>11}{'hw/ideal':>9}{'h200 s':>9}"
        f"{'h200/ideal':>11}{'ex2 table':>10}"
    )
    failed = []
    for i, r in enumerate(rows):
        seed_s = f"{r['seed_s']:.2f}" if "seed_s" in r else "-"
        ratio = f"{r['speedup']:.1f}x" if "speedup" in r else "-"
        dec = f"{r['seed_decode_s']:.2f}" if "seed_decode_s" in r else "-"
        ratio_dec = f"{(r['seed_s'] + r['seed_decode_s']) / r['ours_s']:.1f}x" if "seed_s" in r else "-"
        seed_cpu = f"{r['seed_cpu_s']:.2f}" if "seed_cpu_s" in r else "-"
        cpu_ratio = f"{r['seed_cpu_s'] / r['ours_cpu_s']:.1f}x" if "seed_cpu_s" in r else "-"
        print(
            f"{r['case']:<28}{seed_s:>9}{dec:>9}{r['ours_s']:>9.2f}{ratio:>8}{ratio_dec:>10}{r['peak_ratio']:>13.2f}"
            f"{seed_cpu:>10}{r['ours_cpu_s']:>10.2f}{cpu_ratio:>10}"
            + (f"{r['hw_s']:>11.2f}{r['hw_s'] / r['ours_s']:>8.1f}x" if "hw_s" in r else f"{'-':>11}{'-':>9}")
            + (
                f"{r['h200_s']:>9.2f}{r['h200_s'] / r['ours_s']:>10.1f}x{r['h200_s'] / r['h200_cr_ex2_s']:>9.2f}x"
                if "h200_s" in r
                else f"{'-':>9}{'-':>11}{'-':>10}"
            )
        )
        if args.quick:
            continue
        if r["peak_ratio"] > PEAK_MEMORY_RATIO_TARGET:
            failed.append(f"{r['case']}: peak memory {r['peak_ratio']:.2f}x > {PEAK_MEMORY_RATIO_TARGET}x")
        if i < 2 and "speedup" in r and r["speedup"] < SPEEDUP_TARGET:
            failed.append(f"{r['case']}: {r['speedup']:.1f}x < {SPEEDUP_TARGET}x faster than the seed")
        if i == 2 and r["ours_s"] > LONG_SECONDS_TARGET:
            failed.append(f"{r['case']}: {r['ours_s']:.2f} s > {LONG_SECONDS_TARGET} s")
    for f in failed:
        print("MISSED:", f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
