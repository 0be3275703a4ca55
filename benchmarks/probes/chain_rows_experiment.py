"""Experiment (2026-12-03, removed after measuring): the CPU chain of MMA instructions with one batched float64
GEMM for the dots and loose per-row exponent bounds for the fast test. reports/emulator/2026-12-03-cpu-chain-experiments.md."""
# ruff: noqa
import torch, time, math, sys
from mjolnir_numerics import arithmetic as ar
from mjolnir_numerics.arithmetic import _exponent, _truncated_sum, round_toward_zero_f32, OPERAND_FORMATS
from mjolnir_numerics.quantize import quantize, dequantize
torch.set_num_threads(1)
LOW, HIGH = -(1 << 20), 1 << 20
STATS = []

def chain_rows(a, b, c, groups, model, bits_a, bits_b):
    S, k = groups.shape
    _, emin = OPERAND_FORMATS[model.operand]
    order = groups.reshape(-1)
    ag = a.double().index_select(-1, order).unflatten(-1, (S, k))  # (..., M, S, k)
    bg = b.double().index_select(-1, order).unflatten(-1, (S, k))  # (..., N, S, k)
    ea, eb = _exponent(ag, emin), _exponent(bg, emin)
    za, zb = ag == 0, bg == 0
    a_hi = torch.where(za, LOW, ea).amax(-1).movedim(-1, 0)   # (S, ..., M)
    a_lo = torch.where(za, HIGH, ea).amin(-1).movedim(-1, 0)
    b_hi = torch.where(zb, LOW, eb).amax(-1).movedim(-1, 0)   # (S, ..., N)
    b_lo = torch.where(zb, HIGH, eb).amin(-1).movedim(-1, 0)
    dots = torch.matmul(ag.movedim(-2, 0), bg.movedim(-2, 0).transpose(-1, -2))  # (S, ..., M, N)
    thr = 23 + model.extra_bits - bits_a - bits_b
    nan = torch.isnan(ag).flatten(-2).any(-1)[..., :, None] | torch.isnan(bg).flatten(-2).any(-1)[..., None, :] | torch.isnan(c)
    nslow = 0
    for s in range(S):
        c64 = c.double()
        ec = _exponent(c64, -126)
        e_c = torch.where(c64 != 0, ec, LOW)
        up = torch.clamp(torch.maximum(a_hi[s][..., :, None] + b_hi[s][..., None, :], e_c), min=model.min_exponent)
        lo = a_lo[s][..., :, None] + b_lo[s][..., None, :]
        keep = (up - lo <= thr) & ((c64 == 0) | (up - ec <= model.extra_bits))
        r = round_toward_zero_f32(dots[s] + c64)
        slow = ~keep
        n = int(slow.sum()); nslow += n
        if n:
            idx = slow.nonzero(as_tuple=True)
            lead = c64.shape[:-2]
            a_s = ag[..., s, :].expand(*lead, *ag.shape[-3:-2], k)[idx[:-1]]
            b_s = bg[..., s, :].expand(*lead, *bg.shape[-3:-2], k)[(*idx[:-2], idx[-1])]
            ea_s = torch.where(a_s == 0, LOW, _exponent(a_s, emin)); eb_s = torch.where(b_s == 0, LOW, _exponent(b_s, emin))
            e_prod = (ea_s + eb_s).amax(-1)
            big = torch.clamp(torch.maximum(e_prod, e_c[slow]), min=model.min_exponent)
            r[slow] = round_toward_zero_f32(_truncated_sum(a_s * b_s, c64[slow], big - 23 - model.extra_bits))
        c = r
    STATS.append(nslow / (S * c.numel()))
    return torch.where(nan, torch.full_like(c, math.nan), c)

if __name__ == "__main__":
    g=torch.Generator().manual_seed(0)
    def e4(x): return dequantize(quantize(x,"e4m3"),"e4m3").double()
    B,H,M,N,K=32,4,6,128,256
    a=e4(torch.randn(B,H,M,K,generator=g)*20); b=e4(torch.randn(B,H,N,K,generator=g)*20)
    c=torch.zeros(B,H,M,N)
    model=ar.MMA_MODELS["sm90_f16"]
    groups=ar.kstep_groups("mma_sync_sm90","e4m3","e4m3",K)[0]
    def t(f,n=3):
        f(); t0=time.perf_counter()
        for _ in range(n): r=f()
        return (time.perf_counter()-t0)/n*1e3, r
    t1,r1=t(lambda: ar.chain_gemm(a,b,c,groups,model,fused=False))
    for bits in ((3,3),(10,10)):
        STATS.clear()
        t2,r2=t(lambda: chain_rows(a,b,c,groups,model,*bits))
        print(f"chain_gemm {t1:.1f} ms  chain_rows{bits} {t2:.1f} ms  equal {torch.equal(r1.view(torch.int32), r2.view(torch.int32))} slow {STATS[-1]:.3f}")
