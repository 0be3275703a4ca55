# tree: device-combo6 = main + the P.V float32-exponent experiment (MJOLNIR_PV_F32) + the writer candidate;
# .device/base: main without tests. Any GPU: the P.V formulas probe, then the emulator A/B at b32 x 32K.
# On an H200 first: bench_helpers candidate / main / candidate.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
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
st probe; timeout 120 python3 -m benchmarks.probes.emulator_chain --pv-formulas --no-chains > $OUT/probe.txt 2>&1; echo "[rc=$?]" >> $OUT/probe.txt
st ab; timeout $(left 575) python3 -m benchmarks.bench_emulator_gpu --rows b32_32k_e4m3_e4m3q --repeat 4 --ab MJOLNIR_PV_F32 > $OUT/ab.txt 2>&1; echo "[rc=$?]" >> $OUT/ab.txt
st done
