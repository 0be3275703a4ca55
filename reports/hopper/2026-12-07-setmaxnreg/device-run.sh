# tree: branch experiment-setmaxnreg (main + setmaxnreg 176 / 152 for NVFP4 at d = 256). base2: main's kernel (with
# converter warps). Any sm_90 GPU: the bench on both trees back to back (NVFP4 at d = 256 the row that changes,
# e4m3 and NVFP4 d = 128 as controls), then the converter bits test and conformance on the branch (eager emulator).
# Carry: DSL, tvmffi, base2, install.sh, run45.sh.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; cat .device/base2/BASE >> $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
B=$PWD/.device/base2
A="--formats e4m3,nvfp4 --head-dims 256,128 --batches 1,8,32 --back-to-back 20 --no-peers --iters 10"
st bench_new; timeout 60 python3 -m benchmarks.bench_hopper_decode $A > $OUT/bench_new.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_new.txt
st bench_base; (cd $B && PYTHONPATH=$B:$PYTHONPATH timeout 60 python3 -m benchmarks.bench_hopper_decode $A) > $OUT/bench_base.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base.txt
st bench_new2; timeout 60 python3 -m benchmarks.bench_hopper_decode $A > $OUT/bench_new2.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_new2.txt
st tests
export MJOLNIR_COMPILE=0
python3 -m pytest --collect-only -q tests/kernel/test_converter_warps_gpu.py tests/kernel/test_conformance.py -p no:cacheprovider 2>/dev/null | grep '::' > /tmp/all.txt
for i in 0 1 2; do awk -v i=$i 'NR % 3 == i' /tmp/all.txt > /tmp/shard$i.txt; done
left=$(( 300 - ($(date +%s)-t0) )); [ $left -lt 30 ] && left=30
for i in 0 1 2; do
  (timeout $left python3 -m pytest -q -rs -s $(cat /tmp/shard$i.txt) -p no:cacheprovider > $OUT/shard$i.txt 2>&1; echo "[rc=$?] $(( $(date +%s)-t0 )) s" >> $OUT/shard$i.txt) &
done
wait; st done
