"""Measure the GPU's arithmetic where the decode kernels use it, against ``mjolnir_numerics.arithmetic``
(run on the H200; writes its results under ``--out``):

* ``mma``: ``mma.sync.m16n8k16`` with f16 and bf16 operands and fp32 accumulate on random and adversarial
  vectors (wide exponent spread, cancellation, a dominant or tiny accumulator, ties on the alignment grid,
  subnormal operands and results, the decode kernel's own operand mixes), each output compared bit for bit
  with the hardware model and with the ideal one (``mma.json``, and up to 200 mismatches);
* ``ex2``: ``ex2.approx.ftz.f32`` over every fp32 input the kernels can give it (x <= 0 down to the flush
  threshold), bit for bit against the hardware model ``emulator_stages.exp2_sm90_f32`` (``sm90_model`` in
  ``ex2.json``) and against correctly rounded exp2 (subnormal results flushed): the ulp histogram overall
  and per binade, and a test of the shift structure ``ex2(x) = 2^n ex2(x - n)`` (``ex2.json``; raw
  differences on a few binades in ``ex2_binades.npz``);
* ``ex2_raw``: the raw differences from correct rounding on every x of [-1, -2^-25), 2 bits each (xz);
  ``--ex2-table DIR`` (no GPU) packs a run's files into ``mjolnir_numerics/data/ex2_sm90.xz``, the table
  of ``exp2_sm90_f32``;
* ``log``: ``cute.math.log(fastmath=False)`` (the kernels' LSE) over every fp32 from +0 to +inf, against
  the libdevice model ``emulator_stages.log_libdevice_f32`` and correctly rounded log (``log.json``).

    python -m benchmarks.probes.arithmetic_sweep --out DIR [--parts mma,ex2,log,ex2_raw]
    python -m benchmarks.probes.arithmetic_sweep --ex2-table DIR     # DIR: an ex2_raw run's files
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

PARTS = ("mma", "ex2", "log", "ex2_raw")
DEV = "cuda"  # the device of the generated inputs (the tests set "cpu" to check the generators)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


# -- mma ------------------------------------------------------------------------------------------------
def _signs(shape, gen):
    return torch.where(torch.rand(shape, generator=gen, device=DEV) < 0.5, -1.0, 1.0).double()


def _pow2_values(shape, lo, hi, gen):
    e = torch.randint(lo, hi + 1, shape, generator=gen, device=DEV).double()
    return (1 + torch.rand(shape, generator=gen, device=DEV).double()) * torch.exp2(e) * _signs(shape, gen)


def mma_cases(operand: str, gen, scale: int = 1):
    """{name: (a (T, 16, 16), b (T, 8, 16), c (T, 16, 8))}: float64 values exactly representable in
    ``operand`` (f16 or bf16) and fp32 c."""
    dt = torch.float16 if operand == "f16" else torch.bfloat16
    lo, hi = (-24, 14) if operand == "f16" else (-60, 60)

    def q(x):
        return x.to(dt).double()

    def c32(x):
        return x.float()

    T = 1024 * scale
    shapes = ((T, 16, 16), (T, 8, 16), (T, 16, 8))
    r = lambda s: torch.randn(s, generator=gen, device=DEV).double()  # noqa: E731
    cases = {}
    ints = [torch.randint(-8, 8, s, generator=gen, device=DEV).double() for s in shapes]
    cases["small_ints"] = (ints[0], ints[1], ints[2].float())
    cases["normal"] = (q(r(shapes[0])), q(r(shapes[1])), c32(r(shapes[2])))
    cases["wide_exponents"] = (q(_pow2_values(shapes[0], lo, hi, gen)), q(_pow2_values(shapes[1], lo, hi, gen)),
                               c32(_pow2_values(shapes[2], 2 * lo, 2 * hi, gen)))  # fmt: skip
    a, b = q(r(shapes[0])), q(r(shapes[1]))
    a[..., 8:] = a[..., :8]
    b[..., 8:] = q(-b[..., :8] * (1 + torch.exp2(-torch.randint(1, 12, b[..., :8].shape, generator=gen,
                                                                 device=DEV).double())))  # fmt: skip
    cases["cancellation"] = (a, b, torch.zeros(shapes[2], device=DEV))
    cases["c_dominant"] = (q(r(shapes[0])), q(r(shapes[1])), c32(_pow2_values(shapes[2], 8, 24, gen)))
    cases["c_tiny"] = (q(r(shapes[0])), q(r(shapes[1])), c32(_pow2_values(shapes[2], -40, -20, gen)))
    # ties: products of powers of two and 1 + 2^-k on the alignment grid's half points
    ka = torch.randint(0, 8, shapes[0], generator=gen, device=DEV).double()
    cases["ties"] = (q(torch.exp2(-ka) * _signs(shapes[0], gen) * (1 + 2.0**-7)), q(torch.exp2(-ka[:, :8])),
                     c32(torch.exp2(torch.randint(0, 4, shapes[2], generator=gen, device=DEV).double())))  # fmt: skip
    sub_lo = -24 if operand == "f16" else -133
    cases["subnormal_operands"] = (q(_pow2_values(shapes[0], sub_lo, sub_lo + 12, gen)), q(r(shapes[1]) * 64),
                                   c32(_pow2_values(shapes[2], -30, -10, gen)))  # fmt: skip
    if operand == "bf16":
        tiny = [q(_pow2_values(shapes[i], -75, -65, gen)) for i in (0, 1)]
        cases["subnormal_results"] = (*tiny, c32(_pow2_values(shapes[2], -150, -126, gen)))
    # the decode kernel's operand mixes: e4m3 values (as f16 or bf16), P = e4m3(p * 448) times V
    e4m3 = lambda s, sc: (r(s) * sc).clamp(-448, 448).to(torch.float8_e4m3fn).double()  # noqa: E731
    p = (torch.rand(shapes[0], generator=gen, device=DEV) ** 8 * 448).to(torch.float8_e4m3fn).double()
    cases["decode_pv"] = (q(p), q(e4m3(shapes[1], 30)), c32(r(shapes[2]) * 1000))
    cases["decode_qk"] = (q(e4m3(shapes[0], 100)), q(e4m3(shapes[1], 100)), torch.zeros(shapes[2], device=DEV))
    return cases


def _same(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bit-identical, or both NaN (NaN payloads are not modelled)."""
    return (_bits(x) == _bits(y)) | (torch.isnan(x) & torch.isnan(y))


VECTORS_PER_CASE = 32  # tests (128 dot products each) per case kept in mma_vectors.npz, for the CPU tests


def run_mma(out: Path, scale: int) -> dict:
    from benchmarks.probes.arith_probe import compile_mma_probe, run_mma as run_probe
    from mjolnir_numerics.arithmetic import MMA_MODELS, block_fma, ideal_block

    gen = torch.Generator(device=DEV).manual_seed(0)
    summary, samples, vectors = {}, [], {}
    for operand in ("f16", "bf16"):
        dt = torch.float16 if operand == "f16" else torch.bfloat16
        compiled = compile_mma_probe(operand == "bf16")
        model = MMA_MODELS[f"sm90_{operand}"]
        for name, (a, b, c) in mma_cases(operand, gen, scale).items():
            hw = run_probe(compiled, a.to(dt).view(torch.int16), b.to(dt).view(torch.int16), c)
            aa, bb = a[:, :, None, :], b[:, None, :, :]  # (T, 16, 8, 16)
            model_d = block_fma(aa, bb, c, model)
            ideal_d = ideal_block(aa, bb, c)
            bad = ~_same(hw, model_d)
            summary[f"{operand}/{name}"] = {
                "dots": int(hw.numel()),
                "model_mismatches": int(bad.sum()),
                "ideal_mismatches": int((~_same(hw, ideal_d)).sum()),
            }
            k = VECTORS_PER_CASE
            key = f"{operand}__{name}"
            vectors[key + "__a"] = a[:k].to(dt).view(torch.int16).cpu().numpy()
            vectors[key + "__b"] = b[:k].to(dt).view(torch.int16).cpu().numpy()
            vectors[key + "__c"] = c[:k].cpu().numpy()
            vectors[key + "__d"] = hw[:k].cpu().numpy()
            for idx in bad.nonzero()[:20].tolist():
                t, i, j = idx
                samples.append({"case": f"{operand}/{name}", "a": a[t, i].tolist(), "b": b[t, j].tolist(),
                                "c": float(c[t, i, j]), "hw": float(hw[t, i, j]), "model": float(model_d[t, i, j]),
                                "ideal": float(ideal_d[t, i, j])})  # fmt: skip
            print(f"mma {operand}/{name}: {summary[f'{operand}/{name}']}", flush=True)
    total = sum(v["dots"] for v in summary.values())
    bad = sum(v["model_mismatches"] for v in summary.values())
    result = {"dots": total, "model_mismatches": bad, "cases": summary, "samples": samples[:200]}
    (out / "mma.json").write_text(json.dumps(result, indent=1))
    np.savez_compressed(out / "mma_vectors.npz", **vectors)
    return result


# -- ex2 ------------------------------------------------------------------------------------------------
EX2_LOWEST = -150.0  # below this the result is 0 (subnormal results flush) for any model
CHUNK = 1 << 26


def _neg_floats(lo_bits: int, hi_bits: int):
    """Chunks of the fp32 values with bit patterns lo_bits .. hi_bits - 1 (negative: magnitudes rising)."""
    for start in range(lo_bits, hi_bits, CHUNK):
        stop = min(hi_bits, start + CHUNK)
        idx = torch.arange(start, stop, dtype=torch.int64, device=DEV)
        yield (idx - (1 << 32) if start >= (1 << 31) else idx).to(torch.int32).view(torch.float32)


def ex2_reference(x: torch.Tensor) -> torch.Tensor:
    """The ex2 model of the spec (``emulator_stages.exp2_f32``): correctly rounded exp2, subnormal results
    flushed to +0."""
    from mjolnir_numerics.emulator_stages import exp2_f32

    return exp2_f32(x)


EX2_RAW_BINADES = (0, 1, 2, 3, 8, 16)  # [-2^-k, -2^-(k+1)): hw - model diffs kept raw in ex2_binades.npz


def _binade(x: torch.Tensor) -> torch.Tensor:
    """k with |x| in [2^-(k+1), 2^-k) (fp32 exponent field; -1 for |x| >= 1, clamped at 150)."""
    e = ((_bits(x) >> 23) & 0xFF).long()
    return (126 - e).clamp(-1, 150)


def run_ex2(out: Path, lo=0x80000000, hi=None, probe=None) -> dict:
    """Every fp32 x <= 0 down to the flush threshold: hw - model ulp histogram, overall and per binade of x;
    the shift structure ``hw(x) == 2^n hw(x - n)`` (n = floor(x) + 1, x - n in [-1, 0), exact) for x < -1;
    the raw diffs of ``EX2_RAW_BINADES``. ``probe``: (compiled, run_unary) (default: the GPU's);
    ``lo`` / ``hi``: the bit patterns swept."""
    if probe is None:
        from benchmarks.probes.arith_probe import compile_unary_probe, run_unary

        probe = (compile_unary_probe("ex2"), run_unary)
    compiled, run_unary = probe
    hi = int(np.float32(EX2_LOWEST).view(np.uint32)) + 1 if hi is None else hi
    from mjolnir_numerics.emulator_stages import exp2_sm90_f32

    hist, per_binade, raw, off_cr, off_sm90 = {}, {}, {}, [], []
    n_total = shift_checked = shift_bad = sm90_bad = 0
    for x in _neg_floats(lo, hi):
        hw = run_unary(compiled, x)
        bad = _bits(exp2_sm90_f32(x)) != _bits(hw)
        sm90_bad += int(bad.sum())
        if len(off_sm90) < 64 and bool(bad.any()):
            off_sm90 += [[xv, hv] for xv, hv in zip(x[bad][:8].tolist(), hw[bad][:8].tolist())]
        d = (_bits(hw).long() - _bits(ex2_reference(x)).long()).clamp(-8, 8)
        kb = _binade(x)
        for v, cnt in zip(*(t.tolist() for t in torch.unique(d, return_counts=True))):
            hist[v] = hist.get(v, 0) + cnt
        key = (kb + 1) * 32 + (d + 8)  # (binade, diff) pairs in one unique
        for v, cnt in zip(*(t.tolist() for t in torch.unique(key, return_counts=True))):
            b, dv = divmod(v, 32)
            per_binade.setdefault(str(b - 1), {})[str(dv - 8)] = cnt
        for k in EX2_RAW_BINADES:
            sel = kb == k
            if bool(sel.any()):
                raw.setdefault(f"x_bits_{k}", []).append(_bits(x[sel]).cpu().numpy())
                raw.setdefault(f"diff_{k}", []).append(d[sel].to(torch.int8).cpu().numpy())
        if len(off_cr) < 64:
            off = d != 0
            off_cr += [[xv, hv] for xv, hv in zip(x[off][:8].tolist(), hw[off][:8].tolist())]
        big = x < -1.0
        if bool(big.any()):
            xb = x[big]
            n = torch.floor(xb) + 1.0
            pred = torch.ldexp(run_unary(compiled, (xb - n).contiguous()), n)  # x - n exact: same grid
            pred = torch.where(pred < 2.0**-126, torch.zeros_like(pred), pred)
            shift_bad += int((_bits(pred) != _bits(hw[big])).sum())
            shift_checked += xb.numel()
        n_total += x.numel()
        print(f"ex2 {n_total} inputs, histogram {hist}, sm90 model mismatches {sm90_bad}", flush=True)
    result = {"inputs": n_total, "ulp_diff_histogram": hist, "per_binade": per_binade,
              "shift_structure": {"checked": shift_checked, "mismatches": shift_bad},
              "hw_not_model": off_cr[:64],
              "sm90_model": {"checked": n_total, "mismatches": sm90_bad, "samples": off_sm90[:64]}}  # fmt: skip
    (out / "ex2.json").write_text(json.dumps(result, indent=1))
    np.savez_compressed(out / "ex2_binades.npz", **{k: np.concatenate(v) for k, v in raw.items()})
    return result


def run_ex2_raw(out: Path, binades=range(25), files=3, probe=None) -> dict:
    """The raw ``hw - model`` ulp differences of ex2 on the binades ``[-2^-k, -2^-(k+1))`` (k in ``binades``;
    the ones where it is not correctly rounded), inputs in bit order, 2 bits each (d + 2, d in -2..1),
    xz-compressed, in ``files`` files ``ex2_raw_<first>_<last>.xz``: the data for modelling it offline."""
    import lzma

    if probe is None:
        from benchmarks.probes.arith_probe import compile_unary_probe, run_unary

        probe = (compile_unary_probe("ex2"), run_unary)
    compiled, run_unary = probe
    binades = list(binades)
    per = -(-len(binades) // files)
    written = {}
    for f in range(0, len(binades), per):
        group = binades[f : f + per]
        blobs = []
        for k in group:
            start = 0x80000000 | ((126 - k) << 23)
            (x,) = list(_neg_floats(start, start + (1 << 23)))
            d = _bits(run_unary(compiled, x)).long() - _bits(ex2_reference(x)).long()
            if int(d.min()) < -2 or int(d.max()) > 1:
                raise RuntimeError(f"ex2 binade {k}: difference outside -2..1")
            c = (d + 2).to(torch.uint8).view(-1, 4).cpu()
            blobs.append((c[:, 0] | (c[:, 1] << 2) | (c[:, 2] << 4) | (c[:, 3] << 6)).numpy().tobytes())
        name = f"ex2_raw_{group[0]}_{group[-1]}.xz"
        (out / name).write_bytes(lzma.compress(b"".join(blobs), preset=6))
        written[name] = group
        print(f"ex2_raw: {name} {(out / name).stat().st_size} bytes", flush=True)
    return written


# -- log ------------------------------------------------------------------------------------------------
def _pos_floats(lo_bits: int, hi_bits: int):
    for start in range(lo_bits, hi_bits, CHUNK):
        yield torch.arange(start, min(hi_bits, start + CHUNK), dtype=torch.int32, device=DEV).view(torch.float32)


LOG_SPECIALS = (0.0, -0.0, -1.0, -1e-40, -math.inf, math.nan, 2.0**-149, 2.0**-126, 1.0)


def run_log(out: Path, lo=0, hi=0x7F800001, probe=None) -> dict:
    """Every fp32 from +0 to +inf (and ``LOG_SPECIALS``): hw against the libdevice model
    (``emulator_stages.log_libdevice_f32``, must match every bit) and against correctly rounded log."""
    from mjolnir_numerics.emulator_stages import log_f32, log_libdevice_f32

    if probe is None:
        from benchmarks.probes.arith_probe import compile_unary_probe, run_unary

        probe = (compile_unary_probe("log"), run_unary)
    compiled, run_unary = probe
    n_total, mismatches, hist, samples, off_cr = 0, 0, {}, [], []
    specials = torch.tensor(LOG_SPECIALS, dtype=torch.float32, device=DEV)
    for x in itertools.chain([specials], _pos_floats(lo, hi)):
        hw = run_unary(compiled, x)
        bad = ~_same(hw, log_libdevice_f32(x))
        mismatches += int(bad.sum())
        for xv, hv in zip(x[bad][:20].tolist(), hw[bad][:20].tolist()):
            samples.append({"x": xv, "hw": hv})
        fin = torch.isfinite(hw)
        d = (_bits(hw[fin]).long() - _bits(log_f32(x[fin])).long()).clamp(-8, 8)
        if len(off_cr) < 64:  # inputs where the hardware is not correctly rounded: CPU test vectors
            off = d != 0
            off_cr += [[xv, hv] for xv, hv in zip(x[fin][off][:8].tolist(), hw[fin][off][:8].tolist())]
        for v, cnt in zip(*(t.tolist() for t in torch.unique(d, return_counts=True))):
            hist[v] = hist.get(v, 0) + cnt
        n_total += x.numel()
    result = {"inputs": n_total, "model_mismatches": mismatches, "ulp_diff_vs_correctly_rounded": hist,
              "samples": samples[:200], "hw_not_correctly_rounded": off_cr[:64]}  # fmt: skip
    (out / "log.json").write_text(json.dumps(result, indent=1))
    print(f"log: {result}", flush=True)
    return result


def write_ex2_table(raw_dir: Path, dest: Path) -> int:
    """Concatenate an ``ex2_raw`` run's files (binades 0 .. 24 in order) into one xz file at ``dest``, the
    table ``emulator_stages.exp2_sm90_f32`` reads. Returns its size in bytes.

    Raises:
        FileNotFoundError: ``raw_dir`` holds no ``ex2_raw_<first>_<last>.xz`` file.
        ValueError: the files do not cover binades 0 .. 24 exactly once, or hold the wrong number of bytes."""
    import lzma

    names = sorted(raw_dir.glob("ex2_raw_*_*.xz"), key=lambda p: int(p.stem.split("_")[2]))
    if not names:
        raise FileNotFoundError(f"{raw_dir}: no ex2_raw_<first>_<last>.xz files (run --parts ex2_raw)")
    covered = [k for p in names for k in range(int(p.stem.split("_")[2]), int(p.stem.split("_")[3]) + 1)]
    if covered != list(range(25)):
        raise ValueError(f"{raw_dir}: the files cover binades {covered}, expected 0 .. 24 once each")
    raw = b"".join(lzma.decompress(p.read_bytes()) for p in names)
    if len(raw) != 25 << 21:
        raise ValueError(f"{raw_dir}: {len(raw)} bytes of differences, expected {25 << 21}")
    dest.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    return dest.stat().st_size


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder for the results")
    ap.add_argument("--ex2-table", metavar="DIR", help="pack an ex2_raw run's files into the package's ex2 table")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {PARTS}")
    ap.add_argument("--mma-scale", type=int, default=1, help="1024 * N tests (128 dot products each) per case")
    args = ap.parse_args(argv)
    if args.ex2_table:
        from mjolnir_numerics import emulator_stages

        dest = Path(emulator_stages.__file__).parent / emulator_stages.EX2_SM90_TABLE
        print(f"{dest}: {write_ex2_table(Path(args.ex2_table), dest)} bytes")
        return 0
    if not args.out:
        ap.error("--out: required (the folder for the results), unless --ex2-table")
    parts = [p for p in args.parts.split(",") if p]
    if any(p not in PARTS for p in parts):
        ap.error(f"--parts: {args.parts!r}; allowed {PARTS}")
    if not torch.cuda.is_available():
        print("arithmetic_sweep: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for part in parts:
        t0 = time.perf_counter()
        {
            "mma": lambda: run_mma(out, args.mma_scale),
            "ex2": lambda: run_ex2(out),
            "log": lambda: run_log(out),
            "ex2_raw": lambda: run_ex2_raw(out),
        }[part]()
        print(f"{part}: {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
