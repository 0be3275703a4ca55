"""What walking each chunk in two interleaved tile streams (``EmulatorKnobs(tile_streams=2)``: two warpgroups on
alternate KV tiles, each with its own online softmax, merged by the split reduction) does to accuracy, against
the front-to-back walk every kernel runs today: O's relative L2 error and the largest LSE error against the
exact float64 reference (``reference_decode``), and how many O elements differ in bits between the walks.

Synthetic post-RoPE K/V of several kinds (``mjolnir_numerics.synthetic``), e4m3 Q, the H200 target's arithmetic
(its MMA, ex2 and log models), per-head descales; unsplit (one chunk per sequence, the walk's whole effect) and
the default plan. CPU, about a minute:

    python -m benchmarks.probes.tile_streams_accuracy [--seq-len 4096] [--num-seqs 4]
"""

from __future__ import annotations

import argparse

import torch

from mjolnir_numerics.cache import PagedKVCache
from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_numerics.reference import error_metrics, reference_decode
from mjolnir_numerics.scales import quantize_q
from mjolnir_numerics.synthetic import make_kv

KINDS = ("gaussian", "sinks", "heavy_tail", "peaked")
FORMATS = ("e4m3", "e2m1", "nvfp4")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--num-seqs", type=int, default=4)
    ap.add_argument("--heads", default="16/4", help="h_q/h_k")
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args(argv)
    h_q, h_k = (int(x) for x in args.heads.split("/"))
    print(f"# b {args.num_seqs}, L {args.seq_len}, {h_q}/{h_k} heads, d {args.head_dim}, e4m3 Q, target h200")
    print("# rel L2: |O - O_ref| / |O_ref| (float64 reference); LSE: max |LSE - LSE_ref|; bits: O elements whose")
    print("# bf16 bits differ between the walks")
    print(f"{'kind':<11}{'format':<7}{'plan':<10}{'rel L2 1 stream':>17}{'rel L2 2 streams':>18}"
          f"{'LSE err 1':>11}{'LSE err 2':>11}{'bits differ':>13}")  # fmt: skip
    for kind in KINDS:
        data = make_kv(kind, args.num_seqs, args.seq_len, h_q, h_k, args.head_dim, seed=1)
        o_ref, lse_ref = reference_decode(data.q, data.k, data.v, softmax_scale=data.softmax_scale)
        q8, qd = quantize_q(data.q, args.num_seqs, 1, h_k)
        for fmt in FORMATS:
            cache = PagedKVCache.from_float(data.k, data.v, fmt, granularity="per_head")
            for plan_name, chunk in (("unsplit", 0), ("default", None)):
                rows, outs = [], []
                for streams in (1, 2):
                    o, lse = emulate_decode(
                        q8, cache, q_descale=qd, softmax_scale=data.softmax_scale, chunk_tiles=chunk,
                        target="h200", knobs=EmulatorKnobs(tile_streams=streams),
                    )  # fmt: skip
                    rows.append(error_metrics(str(streams), o, o_ref, lse, lse_ref))
                    outs.append(o)
                differ = (outs[0].view(torch.int16) != outs[1].view(torch.int16)).float().mean().item()
                print(f"{kind:<11}{fmt:<7}{plan_name:<10}{rows[0].rel_l2:>17.3e}{rows[1].rel_l2:>18.3e}"
                      f"{rows[0].lse_max_abs:>11.2e}{rows[1].lse_max_abs:>11.2e}{differ:>12.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
