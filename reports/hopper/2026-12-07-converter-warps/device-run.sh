# tree: experiment-converter-warps (main + HopperConfig.converter_warps). Any sm_90 GPU (a ratio within one run):
# the converter-warp kernel against the default one on the same pools, back to back, then its GPU bits test.
# Carry: the DSL, tvmffi, install.sh, run39.sh (about 64 MB with the tree).
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; git log --oneline -1 >> $OUT/gpu.txt 2>/dev/null
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
st bench
timeout $(left 330) python3 -m benchmarks.bench_hopper_decode --converter-warps 0,4,8 --formats e2m1,nvfp4,e3m2 \
  --head-dims 128,256 --batches 8,32 --back-to-back 20 --no-peers --iters 10 > $OUT/bench.txt 2>&1; echo "[rc=$?]" >> $OUT/bench.txt
st tests
timeout $(left 585) python3 -m pytest -q --maxfail=5 tests/kernel/test_converter_warps_gpu.py -p no:cacheprovider > $OUT/tests.txt 2>&1; echo "[rc=$?]" >> $OUT/tests.txt
st done
