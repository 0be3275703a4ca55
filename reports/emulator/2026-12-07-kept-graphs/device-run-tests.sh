# tree: main; the emulator's GPU tests, three processes at once (compiling is on the CPU: 16 cores), with the
# compiled graphs' cache carried in; then the other numerics GPU tests
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
echo "tree $(git rev-parse --short HEAD 2>/dev/null || cat .device/head)" >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
P="python3 -m pytest -q -p no:cacheprovider --durations=0"
F=tests/numerics/test_emulator.py
export OMP_NUM_THREADS=4
st tests
timeout 520 $P $F -m gpu -k "bit_identical and h200" > $OUT/tests_a.txt 2>&1 & pa=$!
timeout 520 $P $F -m gpu -k "bit_identical and not h200" > $OUT/tests_b.txt 2>&1 & pb=$!
timeout 520 $P $F -m gpu -k "not bit_identical" > $OUT/tests_c.txt 2>&1 & pc=$!
timeout 520 $P tests/numerics -m gpu --ignore=$F > $OUT/tests_d.txt 2>&1 & pd=$!
wait $pa; echo "[rc=$?]" >> $OUT/tests_a.txt; wait $pb; echo "[rc=$?]" >> $OUT/tests_b.txt
wait $pc; echo "[rc=$?]" >> $OUT/tests_c.txt; wait $pd; echo "[rc=$?]" >> $OUT/tests_d.txt
st done
