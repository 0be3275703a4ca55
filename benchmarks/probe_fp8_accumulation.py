"""How exactly does the GPU's fp8 tensor core add up a dot product? (NUMERICS.md section 4)

The spec (``mjolnir_numerics.emulator_stages``, model 1) treats a tensor-core dot product as the exact
sum of the exact products, rounded once to fp32. This probe measures how far an fp8 (e4m3 x e4m3 ->
fp32) matrix product on this GPU is from that model, for contraction lengths K = 32 .. 256 (S = K.Q
spans d = 128 / 256; P.V spans the 128 keys of one tile), through ``torch._scaled_mm`` (cuBLASLt; on
Hopper its fp8 GEMMs are wgmma). ``use_fast_accum=True`` keeps the whole K in the tensor core's
accumulator; ``False`` lets cuBLAS promote partial sums to fp32 registers.

For each case it prints the fraction of outputs equal to the correctly rounded fp32 of the exact sum,
and the largest error in units of ``2^-24 * sum_i |a_i b_i|`` (the spec's per-term bound is ``K`` of
those units, :data:`mjolnir_numerics.emulator_stages.TENSOR_CORE_REL_BOUND`).

    python -m benchmarks.probe_fp8_accumulation            # on a GPU with fp8 tensor cores
"""

from __future__ import annotations

import argparse

import torch

E4M3 = torch.float8_e4m3fn


def _operands(kind: str, m: int, n: int, k: int, gen: torch.Generator, device) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 (m, k) and (k, n) operands: ``qk`` Gaussian Q and K (S), ``pv`` P = e4m3(p * 448) of
    softmax-like p against Gaussian V, ``codes`` every finite e4m3 code uniformly (worst case)."""
    if kind == "codes":
        codes = torch.randint(0, 256, (m + n, k), generator=gen)
        codes = torch.where((codes & 0x7F) == 0x7F, codes & 0x80, codes)  # NaN codes -> +-0
        vals = codes.to(torch.uint8).view(E4M3)
        a, b = vals[:m], vals[m:]
    elif kind == "qk":
        a = (torch.randn(m, k, generator=gen) * 2).to(E4M3)
        b = (torch.randn(n, k, generator=gen) * 2).to(E4M3)
    elif kind == "pv":
        s = torch.randn(m, k, generator=gen) * 3
        p = torch.exp(s - s.amax(dim=1, keepdim=True))
        a = (p * 448).to(E4M3)
        b = torch.randn(n, k, generator=gen).to(E4M3)
    else:
        raise ValueError(f"kind={kind!r} (allowed 'codes', 'qk', 'pv')")
    return a.to(device), b.to(device)


def measure(kind: str, k: int, fast_accum: bool, m: int = 256, n: int = 256, seed: int = 0, device="cuda") -> dict:
    """One case: an (m, k) x (k, n) e4m3 product of ``kind`` (see ``_operands``) on ``device``, fp32 out.

    Returns {"identical": fraction of outputs equal to the exact sum rounded once to fp32, "max_units" /
    "p99_units": the worst / 99th-percentile error in units of 2^-24 * sum_i |a_i b_i|}. Raises ValueError
    for an unknown ``kind``; ``torch._scaled_mm`` needs K and the sizes to be multiples of 16."""
    gen = torch.Generator().manual_seed(seed)
    a, b = _operands(kind, m, n, k, gen, device)
    one = torch.ones((), device=device)
    got = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast_accum)
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64.t()  # products are multiples of 2^-18 below 2^18: any order is exact in float64
    ref = exact.float()
    mag = a64.abs() @ b64.abs().t()
    err = (got.double() - exact).abs()
    units = torch.where(mag > 0, err / (mag * 2.0**-24), torch.zeros_like(err))
    return {
        "identical": (got == ref).double().mean().item(),
        "max_units": units.max().item(),
        "p99_units": units.flatten().quantile(0.99).item(),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="32,64,128,256")
    ap.add_argument("--kinds", default="qk,pv,codes")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("probe_fp8_accumulation: needs a CUDA GPU with fp8 tensor cores (sm_89+)")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: e4m3 x e4m3 -> fp32 via torch._scaled_mm")
    print(f"{'kind':6} {'K':>4} {'accum':>6} {'identical':>10} {'max err':>9} {'p99 err':>9}  (err in 2^-24 sum|ab|)")
    for kind in args.kinds.split(","):
        for k in (int(x) for x in args.ks.split(",")):
            for fast in (True, False):
                r = measure(kind, k, fast)
                print(f"{kind:6} {k:4d} {'fast' if fast else 'fp32':>6} {100 * r['identical']:9.2f}% "
                      f"{r['max_units']:9.1f} {r['p99_units']:9.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
