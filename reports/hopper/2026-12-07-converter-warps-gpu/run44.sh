# tree: branch converter-warps. The kernel conformance suite (every format), eager emulator, three shards.
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; t0=$(date +%s)
export MJOLNIR_COMPILE=0
python3 -m pytest --collect-only -q tests/kernel/test_conformance.py -p no:cacheprovider 2>/dev/null | grep '::' > /tmp/all.txt
wc -l /tmp/all.txt > $OUT/count.txt
for i in 0 1 2; do awk -v i=$i 'NR % 3 == i' /tmp/all.txt > /tmp/shard$i.txt; done
left=$(( 125 - ($(date +%s)-t0) ))
for i in 0 1 2; do
  (timeout $left python3 -m pytest -q -rs -s $(cat /tmp/shard$i.txt) -p no:cacheprovider > $OUT/shard$i.txt 2>&1; echo "[rc=$?] $(( $(date +%s)-t0 )) s" >> $OUT/shard$i.txt) &
done
wait
