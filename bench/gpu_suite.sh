#!/usr/bin/env bash
# The GPU checks on one CUDA GPU, most important first, within SUITE_SECONDS (default 570, so that one 10-minute
# device call holds it): the gpu-marked tests (bf16 parity of every backend, compiled training, compiled
# static-cache decoding, FlexAttention at 16k against the chunked path), the 16k-token long-context bench, compiled
# decoding against eager, training throughput and MFU (anGPT, GPT+, nGPT, Llama; eager, then compiled), then, when
# time is left, the compiled step time at the paper's 0.5B shape, and two experiments that need a GPU: the
# width-stability sweep and ListOps (semantic focus, its runs under CUDA MPS where that starts) for the rest of the
# time. A step that would not fit the time left is skipped and named. The benchmarks' figures go into sections of
# docs/results/benchmarks.md that name the device, the experiments' into their study's README.md (experiments/);
# inference_speed prints its table into the log (runs/gpu_suite.log, or $SUITE_LOG).
#   bash bench/gpu_suite.sh            (from the repository root, with the package installed: make install)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
BUDGET=${SUITE_SECONDS:-570}
LOG=${SUITE_LOG:-runs/gpu_suite.log}
mkdir -p "$(dirname "$LOG")"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'gpu_suite: no CUDA device')" || exit 1
DEVICE=$($PY -c "import torch; print(torch.cuda.get_device_name())")
echo "gpu_suite on $DEVICE" | tee $LOG
start=$(date +%s)
status=0
skipped=()

# step SECONDS NAME COMMAND...: run COMMAND under a timeout of SECONDS when that much of the budget is left
step() {
    local seconds=$1 name=$2
    shift 2
    local left=$(( BUDGET - ($(date +%s) - start) ))
    if (( left < seconds )); then
        skipped+=("$name"); echo "== skip $name: ${left} s left, needs ${seconds} s" | tee -a $LOG; return
    fi
    echo "== $name ($(( $(date +%s) - start )) s in)" | tee -a $LOG
    timeout "$seconds" "$@" 2>&1 | tee -a $LOG || { status=1; echo "== $name failed or timed out" | tee -a $LOG; }
}

xdist=$($PY -c "import xdist" 2>/dev/null && echo "-n 8" || true)
# limits from the H200 runs: tests 87-114 s, long context ~15 s a row, compiled decoding 93 s, throughput 153 s
# (eager, then compiled per block), the 0.5B step time with ablations ~140 s
step 150 tests $PY -m pytest -q -m gpu tests/gpu/test_gpu.py -p no:cacheprovider $xdist
tests_line=$(grep -E "[0-9]+ (passed|failed).* in [0-9.]+s" $LOG | tail -1)
step 170 long_context $PY bench/long_context_speed.py
step 110 compiled_decoding $PY bench/inference_speed.py --device cuda --compile --dtype bfloat16 --repeats 3
step 200 throughput $PY bench/throughput.py --device cuda
step 240 step_time_0.5b $PY bench/train_step_time.py --device cuda --bf16 --compile --ablations --hidden 1024 \
    --layers 24 --vocab 50304 --batch 8 --seq 2048 --rounds 10 --warmup 3 --section train_step_time_gpu
step 60 width_stability $PY experiments/width_depth_stability/width_stability.py --device cuda --steps 40 --layers 4 \
    --widths 128 256 512 1024 --variants baseline width_rule width_rule+s_z_speed_256 --precisions fp32 bf16 \
    --section width_stability_gpu
# the semantic-focus paper's ListOps (5000 sequences of 501-599 tokens, 200 epochs) in whatever time is left:
# --time-limit cuts the eight runs (two seeds) in time, and the next suite continues them from their saved state.
# Its runs are processes of small kernels: under CUDA MPS they run side by side instead of taking turns on the GPU
# (an H200, four runs: 1.2-1.6x per epoch). MPS is used only where its daemon starts, in a pipe directory of this
# suite's own (never another's daemon), and serves a CUDA call; the suite stops it at exit.
mps_dir=""
start_mps() {
    command -v nvidia-cuda-mps-control >/dev/null || { echo "== MPS: not installed" | tee -a $LOG; return; }
    mps_dir=$(mktemp -d /tmp/angpt-mps.XXXXXX)
    export CUDA_MPS_PIPE_DIRECTORY=$mps_dir/pipe CUDA_MPS_LOG_DIRECTORY=$mps_dir/log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d && timeout 40 $PY -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
        echo "== MPS on" | tee -a $LOG
    else
        stop_mps; echo "== MPS off: its daemon did not start or serve" | tee -a $LOG
    fi
}
stop_mps() {
    [ -n "$mps_dir" ] || return 0
    echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; rm -rf "$mps_dir"; mps_dir=""
}
trap stop_mps EXIT
left=$(( BUDGET - ($(date +%s) - start) ))
if (( left >= 150 )); then
    start_mps
    left=$(( BUDGET - ($(date +%s) - start) ))
    step $left listops $PY experiments/semantic_focus/semantic_focus.py --paper --backbone paper --tasks listops \
        --seeds 2 --device cuda \
        --jobs 8 --time-limit "$(awk "BEGIN {print ($left - 40) / 60}")" \
        --section semantic_focus_paper_encoder_listops_gpu --output-dir runs/semantic_focus-paper-listops-gpu
else
    skipped+=("listops"); echo "== skip listops: ${left} s left, needs 150 s" | tee -a $LOG
fi

$PY - "$DEVICE" "$tests_line" "$(( $(date +%s) - start ))" "${skipped[*]:-none}" <<'PYEOF'
import sys
sys.path.insert(0, "bench")
from results_file import update_section
device, tests, seconds, skipped = sys.argv[1:]
update_section("gpu_suite", f"## GPU suite on {device}\n\n`bash bench/gpu_suite.sh`: gpu-marked tests: {tests}; "
               f"whole suite {seconds} s; steps skipped for time: {skipped}. The GPU sections of this file, and "
               "those the suite writes into the experiments' READMEs, name the same device.")
PYEOF
exit $status
