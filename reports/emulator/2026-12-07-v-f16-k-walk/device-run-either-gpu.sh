# tree: device-combo9 = emulator-cand9 (main + MJOLNIR_PV_F16, MJOLNIR_K_WALK_DECODE, MJOLNIR_NVFP4_SINGLE) + the
# writer candidate (writer-smem-table patches); .device/base: main without tests. Useful on either GPU (no inductor
# cache: the DSL fills the carry):
#  - an H200: bench_helpers candidate / main / candidate (issue 28's writer), then the e4m3 row's PV_F16 arms;
#  - an H100: the e2m1 row's arms (PV_F16, K_WALK_DECODE), then the NVFP4 row's if time is left (issue 24).
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch, tvm_ffi;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
echo "tree $(cat .device/head)" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
B=$PWD/.device/base
base(){ (cd $B && PYTHONPATH=$B:$PYTHONPATH "$@"); }
F=MJOLNIR_PV_F16; K=MJOLNIR_K_WALK_DECODE; N=MJOLNIR_NVFP4_SINGLE
arms(){ st $1; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "$2" --arms-row $1 --repeat 9 > $OUT/$1.txt 2>&1; echo "[rc=$?]" >> $OUT/$1.txt; }
if grep -q H200 $OUT/gpu.txt; then
  st bench_cand1; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand1.txt
  st bench_base1; base timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_base1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base1.txt
  st bench_cand2; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand2.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand2.txt
  arms b32_32k_e4m3_e4m3q "$F=0;$F=1"
else
  arms b32_32k_e2m1 "$F=0,$K=0;$F=1,$K=0;$F=1,$K=1"
  [ $(left 585) -gt 200 ] && arms b32_32k_nvfp4 "$N=0;$N=1"
fi
st done
