# tree: pv-orient (main + the probe's --pv-orientations). Where e2m1's and NVFP4's extra emulator time goes at
# b32 x 32K: one profiled call each (no kernel: the DSL is not needed), one after the other.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ echo $(( $1 - ($(date +%s)-t0) )); }
st e2m1; timeout 330 python3 -m benchmarks.probes.emulator_chain --no-chains --profile b32_32k_e2m1 > $OUT/e2m1.txt 2>&1; echo "[rc=$?]" >> $OUT/e2m1.txt
st nvfp4; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --profile b32_32k_nvfp4 > $OUT/nvfp4.txt 2>&1; echo "[rc=$?]" >> $OUT/nvfp4.txt
st done
