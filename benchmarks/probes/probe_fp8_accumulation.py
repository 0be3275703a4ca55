"""How exactly does the GPU's fp8 tensor core add up a dot product? (docs/numerics.md, "Special functions and
the tensor cores")

The spec (``mjolnir_numerics.emulator_stages``, model 1) treats a tensor-core dot product as the exact
sum of the exact products, rounded once to fp32. This probe measures how far an fp8 (e4m3 x e4m3 ->
fp32) matrix product on this GPU is from that model, for contraction lengths K = 32 .. 256 (S = K.Q
spans d = 128 / 256; P.V spans the 128 keys of one tile), through ``torch._scaled_mm`` (cuBLASLt; on
Hopper its fp8 GEMMs are wgmma). ``use_fast_accum=True`` keeps the whole K in the tensor core's
accumulator; ``False`` lets cuBLAS promote partial sums to fp32 registers.

For each case it prints the fraction of outputs equal to the correctly rounded fp32 of the exact sum,
and the largest error in units of ``2^-24 * sum_i |a_i b_i|`` (the spec's per-term bound is ``K`` of
those units, :data:`mjolnir_numerics.emulator_stages.TENSOR_CORE_REL_BOUND`).

``--mma-sync`` asks the same of the warp-level MMAs the decode kernel is built on
(``benchmarks.probes.mma_probe``, the CuTe DSL): ``mma.sync.m16n8k32`` on the fp8 bytes ("sync8") and,
as the kernel does today, ``mma.sync.m16n8k16`` on the bytes widened exactly to f16 ("sync16"), each
chained over K in fp32 registers; its last column is the fraction of outputs where the two agree.

    python -m benchmarks.probes.probe_fp8_accumulation             # on a GPU with fp8 tensor cores
    python -m benchmarks.probes.probe_fp8_accumulation --mma-sync  # the warp-level MMAs (sm_89+, the CuTe DSL)
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


def error_stats(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> dict:
    """How far fp32 ``got`` (m, n) is from the exact A . B^T of e4m3 ``a`` (m, k) and ``b`` (n, k): the
    fraction equal to the exact sum rounded once, and the worst / 99th-percentile error in units of
    2^-24 * sum_i |a_i b_i|."""
    a64, b64 = a.double(), b.double()
    exact = a64 @ b64.t()  # products are multiples of 2^-18 below 2^18: any order is exact in float64
    mag = a64.abs() @ b64.abs().t()
    err = (got.double() - exact).abs()
    units = torch.where(mag > 0, err / (mag * 2.0**-24), torch.zeros_like(err))
    return {
        "identical": (got == exact.float()).double().mean().item(),
        "max_units": units.max().item(),
        "p99_units": units.flatten().quantile(0.99).item(),
    }


def measure(kind: str, k: int, fast_accum: bool, m: int = 256, n: int = 256, seed: int = 0, device="cuda") -> dict:
    """One case: an (m, k) x (k, n) e4m3 product of ``kind`` (see ``_operands``) on ``device``, fp32 out.

    Returns {"identical": fraction of outputs equal to the exact sum rounded once to fp32, "max_units" /
    "p99_units": the worst / 99th-percentile error in units of 2^-24 * sum_i |a_i b_i|}. Raises ValueError
    for an unknown ``kind``; ``torch._scaled_mm`` needs K and the sizes to be multiples of 16."""
    gen = torch.Generator().manual_seed(seed)
    a, b = _operands(kind, m, n, k, gen, device)
    one = torch.ones((), device=device)
    got = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast_accum)
    return error_stats(got, a, b)


def measure_mma_sync(kind: str, k: int, m: int = 256, n: int = 256, seed: int = 0) -> dict:
    """One case through the warp-level MMAs (``benchmarks.probes.mma_probe``): ``{"sync8": stats,
    "sync16": stats, "agree": fraction of outputs where the two paths give the same fp32}`` (stats as
    ``error_stats``). K must be a multiple of 32."""
    from benchmarks.probes.mma_probe import compile_probe, run_probe

    gen = torch.Generator().manual_seed(seed)
    a, b = _operands(kind, m, n, k, gen, "cuda")
    out = {path: run_probe(compile_probe(k, path), a, b) for path in ("fp8", "f16")}
    torch.cuda.synchronize()
    return {"sync8": error_stats(out["fp8"], a, b), "sync16": error_stats(out["f16"], a, b),
            "agree": (out["fp8"] == out["f16"]).double().mean().item()}  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="32,64,128,256")
    ap.add_argument("--kinds", default="qk,pv,codes")
    ap.add_argument("--mma-sync", action="store_true",
                    help="the warp-level MMAs (fp8 m16n8k32 and f16 m16n8k16) instead of torch._scaled_mm")  # fmt: skip
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.ks.split(",")]
    if args.mma_sync and any(k < 32 or k % 32 for k in ks):
        ap.error(f"--ks: the fp8 mma.sync takes K in steps of 32, got {args.ks}")
    if not torch.cuda.is_available():
        raise SystemExit("probe_fp8_accumulation: needs a CUDA GPU with fp8 tensor cores (sm_89+)")
    if args.mma_sync:
        print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}: e4m3 x e4m3 -> fp32 via mma.sync,"
              " chained over K in fp32 registers")  # fmt: skip
        print("# sync8: m16n8k32 on the fp8 bytes; sync16: m16n8k16 on the bytes widened to f16 (the decode kernel)")
        print(f"{'kind':6} {'K':>4} {'mma':>6} {'identical':>10} {'max err':>9} {'p99 err':>9} {'agree':>7}"
              "  (err in 2^-24 sum|ab|; agree: sync8 == sync16)")  # fmt: skip
        for kind in args.kinds.split(","):
            for k in ks:
                r = measure_mma_sync(kind, k)
                for path in ("sync8", "sync16"):
                    st = r[path]
                    print(f"{kind:6} {k:4d} {path:>6} {100 * st['identical']:9.2f}% {st['max_units']:9.1f}"
                          f" {st['p99_units']:9.1f} {100 * r['agree']:6.2f}%")  # fmt: skip
        return
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
