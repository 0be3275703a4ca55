# tree: pv-f16 (main + MJOLNIR_PV_F16). Any GPU, no kernel (no DSL): b32 x 32K e4m3 and e2m1 rows, V's P.V operand
# as float32 (main) against float16, arms alternating in one process, every call's bits compared across arms.
# Carry .device/inductor-cache.tar.xz (main's graphs of the e4m3 row) to shorten the first warm-up.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
for row in b32_32k_e4m3_e4m3q b32_32k_e2m1; do
  st $row; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "MJOLNIR_PV_F16=0;MJOLNIR_PV_F16=1" --arms-row $row --repeat 9 > $OUT/$row.txt 2>&1; echo "[rc=$?]" >> $OUT/$row.txt
done
st done
