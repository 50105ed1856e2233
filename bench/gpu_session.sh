#!/usr/bin/env bash
# Every GPU figure this project measures without vLLM, in one command: what a GPU box adds to
# bench/results/ (bench/RESULTS.md lists its folders). Each step runs under its own time limit and
# writes its own file under OUT_DIR, most important first, so a machine lent for minutes returns what
# it finished.
#
#   bash bench/gpu_session.sh [OUT_DIR]        (default bench/results/gpu; PYTHON picks the interpreter)
#
# A lent machine has torch and triton but may lack this project's pure dependencies and can fetch
# nothing: wheels put in ./.whl (git-ignored; carry it) are installed into a private folder first, e.g.
#   pip download msgspec transformers peft --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_17_x86_64 -d .whl
#
# Steps: the Triton kernel against the bandwidth floor with a sweep of its launch (memory_score), the
# doctor (kernel vs reference at 1M x 384, a GRPO step of a 4-layer Qwen3-8B-shaped stack, faiss-gpu),
# memory searches while the learner trains on the same GPU (contention: priority vs default streams),
# the GRPO step of the whole 36-layer stack at 4096 and at 16384 tokens a sequence (doctor_36_layers,
# doctor_36_layers_16k: time a token; model-FLOPs utilisation beside the 6N convention's and the
# hardware's share of the bf16 peak, and the recompute's share, mia_engine/doctor/flops.py; a step with
# every layer recomputed for comparison where memory let some keep their activations; peak memory), the
# kernel tests compiled for this GPU (kernel_tests), and the learner's choice of recomputed layers on
# this GPU (learner_gpu_test). steps.txt says how each ended. The limits are about 2-3x the measured
# times and must add up to under 10 minutes: the whole script runs in one device call.
set -u
out=${1:-bench/results/gpu}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# This copy is not pip-installed: the checkout itself provides mia_engine, and a private folder provides
# mia_kernels, the import name setup.py gives the kernels/ folder (package_dir), as a link to it.
links=$(mktemp -d)
ln -s "$PWD/kernels" "$links/mia_kernels"
export PYTHONPATH="$links:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    wheels=$(mktemp -d)
    "$py" -m pip install -q --no-index --no-deps --target "$wheels" .whl/*.whl >"$out/wheels.txt" 2>&1
    export PYTHONPATH="$wheels${PYTHONPATH:+:$PYTHONPATH}"
fi

step() {  # step NAME SECONDS COMMAND...: run it, keep its output, record how it ended
    local name=$1 limit=$2 started=$SECONDS rc
    shift 2
    timeout "$limit" "$@" >"$out/$name.txt" 2>&1
    rc=$?
    echo "$name: rc=$rc in $((SECONDS - started)) s (limit $limit s)" | tee -a "$out/steps.txt"
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$py" -c 'import platform, torch, triton, transformers, peft
print(platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__,
      "transformers", transformers.__version__, "peft", peft.__version__)'
    "$py" scripts/cuda_stack.py driver
} >"$out/machine.txt" 2>&1

step memory_score 80 "$py" bench/bench_memory_score.py --no-main --no-products --no-faiss --gpu-sweep
step doctor 70 "$py" -m mia_engine doctor
step contention 110 "$py" -m mia_engine doctor --checks contention
step doctor_36_layers 110 "$py" -m mia_engine doctor --layers 36 --checks grpo
step doctor_36_layers_16k 130 "$py" -m mia_engine doctor --layers 36 --seq-len 16384 --checks grpo
step kernel_tests 50 "$py" -m pytest tests/kernels/test_memory_score.py --noconftest -q -p no:cacheprovider
step learner_gpu_test 45 "$py" -m pytest tests/learner/test_recompute.py -m gpu --noconftest -q -p no:cacheprovider
