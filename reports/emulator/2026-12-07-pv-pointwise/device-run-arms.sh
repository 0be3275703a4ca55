# tree: pv-pointwise. Any GPU, no kernel (no DSL). Call 2 (only if call 1's chain was faster): the emulator at
# b32 x 32K e4m3, main's tile update and the written-out one alternating in one process, bits compared across arms.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }; t0=$(date +%s)
st arms; timeout 570 python3 -m benchmarks.probes.emulator_chain --no-chains --arms "MJOLNIR_PV_POINTWISE=0;MJOLNIR_PV_POINTWISE=1" --arms-row b32_32k_e4m3_e4m3q --repeat 3 > $OUT/arms.txt 2>&1; echo "[rc=$?]" >> $OUT/arms.txt
st done
