import time, torch
from mjolnir_numerics import emulator as em, arithmetic as ar, emulator_stages as st
st._sync_free = lambda x: True
g = torch.Generator().manual_seed(0)
codes = lambda *s: torch.randint(0, 256, s, generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn).float().nan_to_num(0.0)
A, G, N, D = 3, 2, 4, 128
p = codes(A, G, N, 128); v = codes(A, G, 128, D)
o = torch.randn(A, G, N, D, generator=g) * 64
l = torch.rand(A, G, N, 16, generator=g); corr = torch.ones(A, G, N); p_sum = torch.rand(A, G, N, 16, generator=g)
m = torch.zeros(A, G, N)
model = ar.MMA_MODELS["sm90_f16"]; k = (model.extra_bits, model.min_exponent, ar.OPERAND_FORMATS["f16"][1])
vf = v.unflatten(-2, (8, 16))  # (A, G, S, K, D)
vr = v.transpose(-1, -2).contiguous().unflatten(-1, (8, 16))  # (A, G, D, S, K)
want = em._tile_update(corr, l, p_sum, o, m, m, p, vr, True, *k)
got = em._tile_update_pointwise(corr, l, p_sum, o, m, m, p, vf, True, *k)
print("eager identical:", all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got)))
t0 = time.time()
f = torch.compile(em._tile_update_pointwise, dynamic=True, fullgraph=True)
out = f(corr, l, p_sum, o, m, m, p, vf, True, *k)
print("compiled in", round(time.time() - t0, 1), "s; identical:", all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, out)))
