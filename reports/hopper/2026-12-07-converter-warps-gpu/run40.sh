# tree: device-combo10 = device-combo9 (emulator-cand9's three switches + the writer candidate) merged with
# experiment-converter-warps. .device/base: main 5d5fb67 without tests (the writer's baseline). One call, either GPU:
#  1. converter warps against the default kernel (bench --converter-warps 0,4,8; any sm_90 GPU: a ratio in one run);
#  2. an H200: bench_helpers candidate / main (issue 28's writer), then the e4m3 row's MJOLNIR_PV_F16 arms;
#     an H100: the e2m1 row's MJOLNIR_K_WALK_DECODE arms (two arms fit beside the bench; PV_F16 in another call).
# The converter warps' GPU bits test needs its own call (tests/kernel/test_converter_warps_gpu.py).
# Carry: the DSL, tvmffi, base, install.sh, run40.sh, head10 (about 65 MB with the tree).
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
nvidia-smi -L > $OUT/gpu.txt; echo "tree $(cat .device/head10)" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
B=$PWD/.device/base
base(){ (cd $B && PYTHONPATH=$B:$PYTHONPATH "$@"); }
F=MJOLNIR_PV_F16; K=MJOLNIR_K_WALK_DECODE
arms(){ st $1; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "$2" --arms-row $1 --repeat 9 > $OUT/$1.txt 2>&1; echo "[rc=$?]" >> $OUT/$1.txt; }
st converters
timeout $(left 220) python3 -m benchmarks.bench_hopper_decode --converter-warps 0,4,8 --formats e2m1,nvfp4,e3m2 \
  --head-dims 128,256 --batches 8,32 --back-to-back 20 --no-peers --iters 10 > $OUT/converters.txt 2>&1; echo "[rc=$?]" >> $OUT/converters.txt
if grep -q H200 $OUT/gpu.txt; then
  st bench_cand; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand.txt
  st bench_base; base timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_base.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base.txt
  arms b32_32k_e4m3_e4m3q "$F=0;$F=1"
else
  arms b32_32k_e2m1 "$F=0,$K=0;$F=0,$K=1"
fi
st done
