# tree: pv-pointwise (main + MJOLNIR_PV_POINTWISE). Any GPU, no kernel (no DSL). 1) one tile's P.V chain, the
# reduction (main) against the products written out, CUDA-graph timed, bits compared; 2) the emulator at
# b32 x 32K e4m3, both arms alternating in one process, bits compared across arms. Carry the inductor cache.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ echo $(( $1 - ($(date +%s)-t0) )); }
st chain; timeout 240 python3 -m benchmarks.probes.emulator_chain --no-chains --pv-pointwise > $OUT/chain.txt 2>&1; echo "[rc=$?]" >> $OUT/chain.txt
st arms; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "MJOLNIR_PV_POINTWISE=0;MJOLNIR_PV_POINTWISE=1" --arms-row b32_32k_e4m3_e4m3q --repeat 3 > $OUT/arms.txt 2>&1; echo "[rc=$?]" >> $OUT/arms.txt
st done
