#!/usr/bin/env bash
# The whole GPU set on one CUDA GPU, in under 10 minutes (issue 12): the gpu-marked tests, compiled training step
# time (GPT+/anGPT/nGPT at the paper's 0.5B shape, with anGPT ablations), the width-stability sweep at
# d = 128 … 1024 in float32 and bf16 (seconds on a GPU), and the compiled decode benchmark when it has --compile.
# Every figure is written into bench/RESULTS.md with the device's name.
#   bash bench/gpu_suite.sh            (from the repository root, with the package installed: make install)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_suite: no CUDA device')"
DEVICE=$($PY -c "import torch; print(torch.cuda.get_device_name())")
echo "gpu_suite on $DEVICE"
start=$(date +%s)
status=0
# 1. CUDA tests: bf16 parity of every backend, compiled training, compiled static-cache decoding (~2 min)
timeout 240 $PY -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider | tee /tmp/gpu_suite_tests.log || status=1
tests_line=$(tail -1 /tmp/gpu_suite_tests.log)
# 2. Compiled training step, 0.5B shape (d=1024, L=24, 16 heads, 8×2048 tokens, bf16), anGPT ablations (~4 min)
timeout 330 $PY bench/train_step_time.py --device cuda --bf16 --compile --ablations --hidden 1024 --layers 24 \
    --vocab 50304 --batch 8 --seq 2048 --rounds 10 --warmup 3 || status=1
# 3. Width stability: 40 steps at d = 128 … 1024, 4 layers, float32 and bf16 (~1 min)
timeout 120 $PY bench/width_stability.py --device cuda --steps 40 --layers 4 --widths 128 256 512 1024 \
    --variants baseline width_rule width_rule+s_z_speed_256 --precisions fp32 bf16 --section width_stability_gpu \
    || status=1
# 3b. The larger presets at full depth, 200 steps each at the recipe defaults (~2 min; a 0.5b step takes ~30 s on CPU)
timeout 240 $PY bench/width_stability.py --device cuda --presets angpt-190m angpt-0.5b angpt-1b --preset-steps 200 \
    --batch 4 --seq 64 --section preset_stability_gpu || status=1
# 4. Compiled decoding (owned by bench/inference_speed.py; run when it supports --compile and --device)
if $PY bench/inference_speed.py --help 2>/dev/null | grep -q -- "--compile"; then
    timeout 120 $PY bench/inference_speed.py --device cuda --compile --dtype bfloat16 || status=1
fi
$PY - "$DEVICE" "$tests_line" "$(( $(date +%s) - start ))" <<'PYEOF'
import sys
sys.path.insert(0, "bench")
from results_file import update_section
device, tests, seconds = sys.argv[1:]
update_section("gpu_suite", f"## GPU suite on {device}\n\n`bash bench/gpu_suite.sh`: gpu-marked tests: {tests}; "
               f"whole suite {seconds} s. The compiled step-time and GPU width-stability sections above name the "
               "same device.")
PYEOF
exit $status
