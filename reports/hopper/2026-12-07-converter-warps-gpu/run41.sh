# tree: experiment-converter-warps 50b71b1. Any sm_90 GPU: the converter warps' GPU bits test (against the spec with
# their walk, and NVFP4 d128 against the default kernel), then the bench with e4m3 beside the sub-byte rows.
# Carry: the DSL, tvmffi, install.sh, run41.sh.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; echo "tree experiment-converter-warps 50b71b1" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
st tests
timeout $(left 480) python3 -m pytest -q -rs --durations=5 --maxfail=5 tests/kernel/test_converter_warps_gpu.py -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "[rc=$?]" >> $OUT/tests.txt
st bench
timeout $(left 585) python3 -m benchmarks.bench_hopper_decode --converter-warps 0,4 --formats e4m3,e3m2,e2m3,nvfp4,e2m1 \
  --head-dims 128,256 --batches 1,8,32 --back-to-back 20 --no-peers --iters 10 > $OUT/bench.txt 2>&1; echo "[rc=$?]" >> $OUT/bench.txt
st done
