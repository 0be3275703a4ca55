# tree: branch converter-warps (main + converter warps as the default for fp6 at d = 128 and NVFP4). base: main's
# kernel. Any sm_90 GPU: the bench on this tree and on base back to back, then the converter warps' bits test
# (eager emulator: MJOLNIR_COMPILE=0), three shards. Carry: DSL, tvmffi, base, install.sh, run43.sh.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; git log --oneline -1 >> $OUT/gpu.txt 2>/dev/null
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
B=$PWD/.device/base
A="--formats e4m3,e3m2,nvfp4 --head-dims 128,256 --batches 8,32 --back-to-back 20 --no-peers --iters 10"
st bench_new; timeout 55 python3 -m benchmarks.bench_hopper_decode $A > $OUT/bench_new.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_new.txt
st bench_base; (cd $B && PYTHONPATH=$B:$PYTHONPATH timeout 55 python3 -m benchmarks.bench_hopper_decode $A) > $OUT/bench_base.txt 2>&1; echo "[rc=$?]" >> $OUT/bench_base.txt
st tests
export MJOLNIR_COMPILE=0
python3 -m pytest --collect-only -q tests/kernel/test_converter_warps_gpu.py -p no:cacheprovider 2>/dev/null | grep '::' > /tmp/all.txt
for i in 0 1 2; do awk -v i=$i 'NR % 3 == i' /tmp/all.txt > /tmp/shard$i.txt; done
left=$(( 215 - ($(date +%s)-t0) )); [ $left -lt 20 ] && left=20
for i in 0 1 2; do
  (timeout $left python3 -m pytest -q -rs $(cat /tmp/shard$i.txt) -p no:cacheprovider > $OUT/shard$i.txt 2>&1; echo "[rc=$?] $(( $(date +%s)-t0 )) s" >> $OUT/shard$i.txt) &
done
wait; st done
