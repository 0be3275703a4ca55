# tree: decode-order (main + switches MJOLNIR_FUSED_PAIRS, MJOLNIR_S_WALK_FUSED, MJOLNIR_PV_CODES_ORDER). Any GPU,
# no kernel (no DSL): the e2m1 and NVFP4 rows at b32 x 32K, four arms alternating in one process, bits compared
# across arms. Carry .device/inductor-cache.tar.xz (graphs of main's e4m3 row) to shorten the first warm-up.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
mkdir -p $TORCHINDUCTOR_CACHE_DIR; [ -f .device/inductor-cache.tar.xz ] && tar -xJf .device/inductor-cache.tar.xz -C $TORCHINDUCTOR_CACHE_DIR
nvidia-smi -L > $OUT/gpu.txt
t0=$(date +%s); st(){ echo "== $1 at $(( $(date +%s)-t0 )) s" >> $OUT/stages.txt; }
left(){ local n=$(( $1 - ($(date +%s)-t0) )); [ $n -gt 1 ] && echo $n || echo 1; }
P=MJOLNIR_FUSED_PAIRS; S=MJOLNIR_S_WALK_FUSED; V=MJOLNIR_PV_CODES_ORDER
A="$P=0,$S=0,$V=0;$P=1,$S=0,$V=0;$P=1,$S=1,$V=0;$P=1,$S=1,$V=1"
for row in b32_32k_e2m1 b32_32k_nvfp4; do
  st $row; timeout $(left 585) python3 -m benchmarks.probes.emulator_chain --no-chains --arms "$A" --arms-row $row --repeat 3 > $OUT/$row.txt 2>&1; echo "[rc=$?]" >> $OUT/$row.txt
done
st done
