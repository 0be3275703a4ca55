# tree: decode-order (dffd9e3), the same warm H100 right after device-run-four-arms.sh (its inductor cache
# still on disk): the one-pass pair lookup alone against main's decode, 9 calls an arm.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/inductor-cache/triton
nvidia-smi -L
for row in b32_32k_e2m1 b32_32k_nvfp4; do
  timeout 280 python3 -m benchmarks.probes.emulator_chain --no-chains --arms "MJOLNIR_FUSED_PAIRS=0;MJOLNIR_FUSED_PAIRS=1" --arms-row $row --repeat 9 > $OUT/$row.txt 2>&1
  echo "[rc=$?]" >> $OUT/$row.txt; tail -8 $OUT/$row.txt
done
