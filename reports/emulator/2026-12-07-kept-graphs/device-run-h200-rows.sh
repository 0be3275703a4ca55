# Next H200 calls 2 and 3 (any tree; runs main's code from .device/base): the other b32 x 32K rows of issue 24's
# goals, about 250 s a row (most of it compiling): ROWS=b32_32k_e4m3_bf16q,b32_32k_e2m1 bash run27.sh, then
# ROWS=b32_32k_nvfp4 bash run27.sh
source .device/install.sh || exit 1
mkdir -p /tmp/tvmffi && tar -xJf .device/tvmffi.tar.xz -C /tmp/tvmffi && export PYTHONPATH="$PYTHONPATH:/tmp/tvmffi"
nvidia-smi -L > $OUT/gpu.txt; python3 -c "import torch, tvm_ffi;print(torch.__version__, torch.cuda.get_device_name())" >> $OUT/gpu.txt 2>&1
B=$PWD/.device/base
cd $B && PYTHONPATH=$B:$PYTHONPATH timeout 570 python3 -m benchmarks.bench_emulator_gpu \
  --rows ${ROWS:?ROWS: the rows to run} --repeat 3 > $OUT/emulator.txt 2>&1; echo "[rc=$?]" >> $OUT/emulator.txt
