#!/usr/bin/env bash
# The one device run issue 12 needs (an NVIDIA H200 lent by the workplace's `device` tool; ~6 min of its time).
#
# Here, once (packs MLX's CUDA build, ~25 MB, and the pure-Python wheel rlxviz needs that the machine lacks):
#     make gpu-pack                      # -> .gpu/ (git-ignored)
# Then one call of the device tool, from the repository root:
#     run(command="bash benchmarks/gpu_check.sh", carry=[".gpu"], timeout_s=540)
# What it measures (each table also printed to the call's output), written to $OUT:
#     machine.txt          GPU, driver, mlx / torch / onnxruntime versions
#     time-tf32-{1,0}.txt  `rlxviz time minilm-shaped --device gpu --batch 8 --seq 128`, TF32 on (MLX's CUDA default)
#                          and off (`MLX_ENABLE_TF32=0`): every version must be marked ok under both policies
#     bench-gpu-f32.txt    `bench_runtime.py --device gpu` at batch 8, seq 128, full f32: every rlxviz version,
#                          hand-written MLX, PyTorch eager on CUDA, ONNX Runtime (side by side, one run)
#     bench-cpu16.txt      the same on the machine's 16 CPU cores, with `--streams 1 2 4 8 16`
# The machine has python3 3.12 with PyTorch cu130, numpy, scipy, onnx, onnxruntime, safetensors, tokenizers
# (/work/.library/device/KINDS.md); nothing can be fetched there.
set -uo pipefail
out=${OUT:-/tmp/rlxviz-gpu}
mkdir -p "$out"
[ -f .gpu/mlx/install.sh ] || { echo "no .gpu/mlx: run 'make gpu-pack' here first and carry .gpu" >&2; exit 2; }
bash .gpu/mlx/install.sh >"$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
# shellcheck disable=SC1091
source .gpu/mlx/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import mlx.core as mx, torch, onnxruntime as ort; print('mlx', mx.__version__, mx.default_device(),
'| torch', torch.__version__, torch.cuda.is_available(), '| onnxruntime', ort.__version__, ort.get_available_providers())"
  nproc
} 2>&1 | tee "$out/machine.txt"
for tf32 in 1 0; do
  MLX_ENABLE_TF32=$tf32 timeout 150 python3 -m rlxviz.cli time minilm-shaped --device gpu --batch 8 --seq 128 \
    --repeat 20 2>&1 | tee "$out/time-tf32-$tf32.txt"
done
MLX_ENABLE_TF32=0 timeout 200 python3 benchmarks/bench_runtime.py --device gpu --batches 8 --seq 128 --repeat 20 \
  --all-versions 2>&1 | tee "$out/bench-gpu-f32.txt"
timeout 150 python3 benchmarks/bench_runtime.py --device cpu --batches 8 --seq 128 --repeat 5 \
  --streams 1 2 4 8 16 2>&1 | tee "$out/bench-cpu16.txt"
echo "done; files in $out"
