"""The Thor kernel's setmaxnreg split at 2 CTAs per SM, swept (compile only, no GPU): for one 32-row-tile
config, each (MMA/TMA, convert) register target and the spills ptxas reports
(reports/thor/2026-12-02-spills.md).

    python -m benchmarks.probes.thor_register_split --arch sm_110a --head-dim 128 --q-dtype bf16 --kv e4m3
"""

import argparse

import mjolnir_kernel.thor.config as thor_config
from mjolnir_kernel.compile import compile_decode
from mjolnir_kernel.thor.config import ThorConfig

SPLITS = ((56, 88), (48, 88), (56, 80), (48, 80), (40, 80), (40, 72), (32, 72))  # (MMA/TMA, convert)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_110a")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--q-dtype", default="bf16")
    ap.add_argument("--kv", default="e4m3")
    args = ap.parse_args(argv)
    shape = dict(head_dim=args.head_dim, q_tile=32, page_size=128, q_len=4, kv_format=args.kv, q_dtype=args.q_dtype,
                 causal=True, max_splits=1, ctas_per_sm=2)  # fmt: skip
    saved = thor_config.MMA_TMA_REGS_TIGHT, dict(thor_config.CVT_REGS)
    try:
        for mma, cvt in SPLITS:
            thor_config.MMA_TMA_REGS_TIGHT, thor_config.CVT_REGS = mma, {1: saved[1][1], 2: cvt}
            cfg = ThorConfig(**shape)
            dv = cfg.derived
            dec = compile_decode(cfg, args.arch, report=True, use_cache=False).resources["decode"]
            regs = f"MMA/TMA {dv.mma_tma_regs:3d}  convert {dv.convert_regs:3d}  softmax {dv.softmax_regs:3d}"
            print(f"{cfg.short_name()}  {regs}: spill stores/loads {dec.spill_stores}/{dec.spill_loads} B", flush=True)
    finally:
        thor_config.MMA_TMA_REGS_TIGHT, thor_config.CVT_REGS = saved


if __name__ == "__main__":
    main()
