# tree: device-combo8 = main 5d5fb67 + the writer candidate (writer-smem-table patches); .device/base: main without
# tests. On an H200: bench_helpers candidate / main / candidate (issue 28). On either GPU: the cache's GPU tests,
# which take the one-pass 4-bit pair lookup compiled on CUDA (issue 24; landed 5d5fb67 on the H100's A/B).
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch, tvm_ffi;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
echo "tree $(cat .device/head)" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
B=$PWD/.device/base
base(){ (cd $B && PYTHONPATH=$B:$PYTHONPATH "$@"); }
if grep -q H200 $OUT/gpu.txt; then
  st bench_cand1; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand1.txt
  st bench_base1; base timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_base1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base1.txt
  st bench_cand2; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand2.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand2.txt
fi
st cache_tests; timeout $(left ${LIMIT:-320}) python3 -m pytest -q -p no:cacheprovider tests/numerics/test_cache.py -k "cuda" > $OUT/cache_tests.txt 2>&1; echo "[rc=$?]" >> $OUT/cache_tests.txt
st done
