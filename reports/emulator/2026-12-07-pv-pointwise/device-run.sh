# tree: pv-pointwise (main + MJOLNIR_PV_POINTWISE). Any GPU, no kernel (no DSL). Call 1: one tile's P.V chain,
# the reduction (main) against the products written out, CUDA-graph timed, bits compared. The inductor cache is
# written back to $OUT (for call 2: carry it as .device/inductor-cache.tar.xz).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
st chain; timeout 480 python3 -m benchmarks.probes.emulator_chain --no-chains --pv-pointwise > $OUT/chain.txt 2>&1; echo "[rc=$?]" >> $OUT/chain.txt
st pack; (cd /tmp && XZ_OPT="-T16 -6" tar -cJf $OUT/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR --exclude=triton .)
st done
