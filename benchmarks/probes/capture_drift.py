"""How far apart are two machines' float64 SmolLM2 forwards, and how many captured values does that move?

Runs the study's capture (the first ``--tokens`` held-out tokens, float64 forward) on each ``--devices``
entry and prints, per device pair: the largest relative difference of the float64 Q/K/V, and how many
values round differently to float32 and to bfloat16 (the digests of each rounding are printed too, so runs
on different machines can be compared by eye). Per layer for the first pair, to show where it grows.

    python -m benchmarks.probes.capture_drift --devices cpu cuda
"""

from __future__ import annotations

import argparse
import hashlib

import torch

from mjolnir_study import real_model as rm
from mjolnir_study.smollm2 import SmolLM2


def capture64(device: str, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 q ``(n_layers, T, h_q, d)``, k and v ``(n_layers, T, h_k, d)`` of the float64 forward, on the CPU."""
    model = SmolLM2(device=device)
    tokens = rm.heldout_tokens(model, n_tokens)
    _, captured = model._run(tokens, 0, None, None, True, True)
    q, k, v = (torch.stack(parts).cpu() for parts in zip(*captured))
    return q, k, v


def digest(ts, dtype) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.to(dtype).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", nargs="+", default=["cpu"])
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args()
    runs = {d: capture64(d, args.tokens) for d in args.devices}
    for d, ts in runs.items():
        print(
            f"{d}: digests float64 {digest(ts, torch.float64)} float32 {digest(ts, torch.float32)} "
            f"bf16 {digest(ts, torch.bfloat16)}"
        )
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            for label, x, y in zip("qkv", runs[a], runs[b]):
                rel = ((x - y).abs() / y.abs().clamp_min(1e-30)).max().item()
                f32 = (x.float() != y.float()).sum().item()
                b16 = (x.to(torch.bfloat16) != y.to(torch.bfloat16)).sum().item()
                per_layer = [(x[l].float() != y[l].float()).sum().item() for l in range(x.shape[0])]
                print(
                    f"{a} vs {b} {label}: max relative diff {rel:.3g}; of {x.numel()} values, {f32} round differently "
                    f"to float32, {b16} to bf16; float32 moves per layer {per_layer}"
                )


if __name__ == "__main__":
    main()
