# tree: device-combo7 = pv-pointwise (MJOLNIR_PV_POINTWISE) + the writer candidate (writer-cand2's 3 commits);
# .device/base: main without tests. Useful on either GPU:
#  - an H200: bench_helpers candidate / main / candidate (issue 28's writer), then the P.V chain probe;
#  - an H100: the P.V chain probe only (issue 24: reduction against products written out, one tile).
# The inductor cache is written to $OUT afterwards (carry it as .device/inductor-cache.tar.xz into run34.sh).
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
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
st chain; timeout $(left 540) python3 -m benchmarks.probes.emulator_chain --no-chains --pv-pointwise > $OUT/chain.txt 2>&1; echo "[rc=$?]" >> $OUT/chain.txt
st pack; (cd /tmp && XZ_OPT="-T16 -6" timeout $(left 590) tar -cJf $OUT/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR --exclude=triton .)
st done
