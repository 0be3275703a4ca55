"""Where do a study cell's CPU and CUDA bits part? (GPU probe; prints the first stage that differs.)

For each case (a study data item, format, granularity, Q path and P variant) this builds the study's
inputs on the CPU and on CUDA, then compares stage by stage: the float K/V, the cache's pools, scales and
descales, the quantized Q, and the emulator's O and LSE; for the first differing cache element it prints
the input value and both codes. CUDA runs twice: with the compiled helpers (the default) and with
``MJOLNIR_COMPILE=0`` (eager torch), so a difference is pinned on the compiled graphs or on eager code.
The cases are the study cells that differed between CPU and CUDA on 2026-12-03 (found by ``mjolnir
compare``; ``reports/reproducibility/2026-12-03-cpu-vs-h200.md``).

    python -m benchmarks.probes.cpu_vs_cuda
"""

from __future__ import annotations

import os

import torch

from mjolnir_numerics.emulator import EmulatorKnobs, emulate_decode
from mjolnir_study import real_model as rm
from mjolnir_study.study import IDEAL_ARITHMETIC, P_VARIANTS, DataKey, StudyConfig, _synthetic_inputs

CASES = [
    # (kind, seq_len, num_seqs, fmt, granularity, q_dtype, p_variant)
    ("sinks", 1024, 2, "nvfp4", "per_head", "e4m3", "e4m3_x448"),
    ("sinks", 1024, 2, "nvfp4", "per_tensor", "bf16", "e4m3_x448"),
    ("gaussian", 512, 1, "e4m3", "per_head", "e4m3", "e4m3_x448_rounded_sum"),
    ("gaussian", 1024, 2, "e2m1", "per_head", "e4m3", "e4m3_x448"),
]


def run(case, device):
    kind, seq_len, num_seqs, fmt, gran, q_dtype, p_variant = case
    config = StudyConfig.default(device=str(device))
    inp = _synthetic_inputs(DataKey("synthetic", kind, seq_len, num_seqs), config, torch.device(device))
    cache = rm.build_cache(inp.k, inp.v, fmt, gran, page_size=config.page_size, device=torch.device(device))
    q_in, qd = rm.prepare_q(inp.q, q_dtype, num_seqs, inp.k[0].shape[1])
    knobs = EmulatorKnobs(**P_VARIANTS[p_variant], **IDEAL_ARITHMETIC)
    o, lse = emulate_decode(
        q_in, cache, q_descale=qd, softmax_scale=inp.softmax_scale, knobs=knobs, target="thor", allow_unsupported=True
    )
    out = {
        "k_in": torch.cat(inp.k),
        "v_in": torch.cat(inp.v),
        "k_pool": cache.k_pool,
        "v_pool": cache.v_pool,
        "k_scales": cache.k_scales,
        "v_scales": cache.v_scales,
        "k_descale": cache.k_descale,
        "v_descale": cache.v_descale,
        "q_in": q_in,
        "q_descale": qd,
        "o": o,
        "lse": lse,
    }
    return {k: (None if v is None else v.detach().cpu()) for k, v in out.items()}


def _bits(a: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers, flattened (NaN payloads and signed zeros compare)."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    flat = a.reshape(-1)
    return flat.view(ints[a.element_size()]) if a.dtype.is_floating_point or a.element_size() == 1 else flat


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def main() -> None:
    for case in CASES:
        ref = run(case, "cpu")
        for mode in ("compiled", "eager"):
            os.environ["MJOLNIR_COMPILE"] = "1" if mode == "compiled" else "0"
            got = run(case, "cuda")
            diffs = [k for k in ref if not same(ref[k], got[k])]
            print(
                f"{'/'.join(map(str, case))} cuda {mode}: "
                + ("identical" if not diffs else "differ: " + ", ".join(diffs))
            )
            for k in diffs[:4]:
                a, b = ref[k], got[k]
                if a is None or b is None or a.shape != b.shape:
                    print(f"  {k}: {None if a is None else tuple(a.shape)} vs {None if b is None else tuple(b.shape)}")
                    continue
                bad = (_bits(a) != _bits(b)).nonzero()[:, 0]
                i = bad[0].item()
                at = [int(t) for t in torch.unravel_index(bad[0], a.shape)] if a.dim() else []
                print(
                    f"  {k}: {bad.numel()} of {a.numel()} elements differ; first at {at}: "
                    f"cpu {a.reshape(-1)[i].item()!r} cuda {b.reshape(-1)[i].item()!r}"
                )
        os.environ.pop("MJOLNIR_COMPILE", None)


if __name__ == "__main__":
    main()
