"""Wall time of one end-to-end window's forward passes (SmolLM2, 128-token prompt, 128 decode positions):
the unquantized reference and the spec-attention forward per format, one CPU thread unless ``--threads``.

    python -m benchmarks.probes.e2e_forward_time [--threads N] [--formats e4m3 nvfp4 e2m1]
"""

from __future__ import annotations

import argparse
import time

import torch

from mjolnir_study import real_model as rm
from mjolnir_study.smollm2 import SmolLM2, corpus_text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--formats", nargs="+", default=["e4m3", "nvfp4", "e2m1"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = SmolLM2.load()
    tokens = model.tokenize(corpus_text("heldout"))[:256]
    prompt = model.prefill(tokens[:128])
    model.extend(prompt, tokens[128:])  # warm-up
    t0 = time.perf_counter()
    model.extend(prompt, tokens[128:])
    print(f"reference forward: {time.perf_counter() - t0:.2f} s")
    for fmt in args.formats:
        hook = rm.emulated_attention(fmt, "per_head", "e4m3")
        model.extend(prompt, tokens[128:], hook)
        t0 = time.perf_counter()
        model.extend(prompt, tokens[128:], hook)
        print(f"{fmt} spec-attention forward: {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
