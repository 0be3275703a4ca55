# next session: git checkout device-combo5 first (the carried tree is the checked-out branch)
source .device/install.sh || exit 1
# the compiled graphs' caches, brought back at the end (a later call on the same kind of GPU can carry them in
# and skip most of the 90-170 s of compiling per process): unpack a carried one first
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch, tvm_ffi;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ echo $(( $1 - ($(date +%s)-t0) )); }
B=$PWD/.device/base
base(){ (cd $B && PYTHONPATH=$B:$PYTHONPATH "$@"); }
P="python3 -m pytest -q -p no:cacheprovider"
echo "tree $(cat .device/head); base = main" >> $OUT/gpu.txt
if grep -q H200 $OUT/gpu.txt; then
  st helper_tests; timeout 100 $P tests/numerics/test_fused.py tests/numerics/test_nvfp4.py tests/numerics/test_packing.py tests/kernel/test_helpers.py -k "not compiled" > $OUT/helper_tests.txt 2>&1; echo "[rc=$?]" >> $OUT/helper_tests.txt
  st bench_cand1; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand1.txt
  st bench_base1; base timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_base1.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base1.txt
  st bench_cand2; timeout 50 python3 -m benchmarks.bench_helpers --iters 10 > $OUT/bench_cand2.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_cand2.txt
fi
st prefix; timeout 40 python3 -m benchmarks.probes.emulator_prefix > $OUT/prefix_cand.txt 2>&1; echo "[rc=$?]" >> $OUT/prefix_cand.txt
st prefix_base; base timeout 40 python3 -m benchmarks.probes.emulator_prefix > $OUT/prefix_base.txt 2>&1; echo "[rc=$?]" >> $OUT/prefix_base.txt
st ab; timeout 250 python3 -m benchmarks.bench_emulator_gpu --rows b32_32k_e4m3_e4m3q --repeat 4 --ab MJOLNIR_PV_COMPILED_COPY > $OUT/ab.txt 2>&1; echo "[rc=$?]" >> $OUT/ab.txt
st tests; timeout $(left 550) $P tests/numerics/test_emulator.py -m gpu -k "window_graphs or cuda_kept or bit_identical" > $OUT/tests.txt 2>&1; echo "[rc=$?]" >> $OUT/tests.txt
st done
XZ_OPT="-T0 -3" tar -cJf $OUT/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR . 2>/dev/null; ls -la $OUT/inductor-cache.tar.xz >> $OUT/stages.txt
