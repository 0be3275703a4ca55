# tree: emulator-cand9 (main + MJOLNIR_PV_F16, MJOLNIR_K_WALK_DECODE, MJOLNIR_NVFP4_SINGLE). Any GPU, no kernel
# (no DSL): the b32 x 32K e4m3 and NVFP4 rows, arms alternating in one process, every call's bits compared across
# arms. Carry .device/inductor-cache.tar.xz (main's graphs of the e4m3 row) to shorten the first warm-up.
# ROWS=e2m1 runs the e2m1 row's four arms instead.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
F=MJOLNIR_PV_F16; K=MJOLNIR_K_WALK_DECODE; N=MJOLNIR_NVFP4_SINGLE
arms(){ st $1; timeout $(left $3) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "$2" --arms-row $1 --repeat 9 > $OUT/$1.txt 2>&1; echo "[rc=$?]" >> $OUT/$1.txt; }
if [ "${ROWS:-}" = e2m1 ]; then
  arms b32_32k_e2m1 "$F=0,$K=0;$F=1,$K=0;$F=1,$K=1;$F=0,$K=1" 585
else
  arms b32_32k_e4m3_e4m3q "$F=0;$F=1" 300
  arms b32_32k_nvfp4 "$N=0;$N=1" 585
fi
st done
