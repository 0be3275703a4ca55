# Next H200 call 1 (tree: writer-cand2 = main + the writer candidate; .device/base: main without tests).
# On an H200: bench_helpers on both trees (candidate, main, candidate); the emulator at b32 x 32K (e4m3 KV and
# Q) against the kernel with the kept graphs; the Hopper conformance on main's kernel with what time is left.
# On an H100 (all of this has run there): only the emulator row, for a same-day baseline.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch, tvm_ffi;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
echo "tree $(cat .device/head)" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ echo $(( $1 - ($(date +%s)-t0) )); }
B=$PWD/.device/base
base(){ (cd $B && PYTHONPATH=$B:$PYTHONPATH "$@"); }
if grep -q H200 $OUT/gpu.txt; then
  st bench_cand1; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand1.txt
  st bench_base1; base timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_base1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base1.txt
  st bench_cand2; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand2.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand2.txt
fi
st emulator; base timeout 280 python3 -m benchmarks.bench_emulator_gpu --rows b32_32k_e4m3_e4m3q --repeat 4 > $OUT/emulator.txt 2>&1; echo "[rc=$?]" >> $OUT/emulator.txt
if grep -q H200 $OUT/gpu.txt && [ $(left 560) -gt 60 ]; then
  st conform; base env MJOLNIR_COMPILE=0 timeout $(left 560) python3 -m mjolnir_kernel conform --random 30 --jobs 14 > $OUT/conform.txt 2>&1; echo "[rc=$?]" >> $OUT/conform.txt
fi
st done
