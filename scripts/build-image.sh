#!/usr/bin/env bash
# Build the llmgw OCI image: one image for the server, the agent and the mirror.
#
# No image registry is needed: the root file system is Debian 12 built by mmdebstrap
# from Debian's packages, and `podman import` makes it an image. llmgw goes in from a
# wheel of this tree, its dependencies pinned to what this tree's virtual environment
# resolved (`pip freeze`), all built into wheels here first, so the image is made with
# pip offline inside it and needs no network when it runs.
#
# The image is cached: its tag is a hash of the wheels' contents and of this script, and
# the root file system's tar stays in the cache directory, so a second run with nothing
# changed is a `podman image exists` (or an import of the cached tar on a machine whose
# podman storage was wiped). Prints the image's name (localhost/llmgw:HASH) on stdout.
#
# --rootfs: build (or find in the cache) the root file system only, and print its tar's path:
# what the Containerfile beside this script adds, for those who build with buildah or docker.
#
# PYTHON: the interpreter whose pip builds the wheels and whose installed packages pin the
# image's dependencies (default: this tree's .venv/bin/python, else python3 from the PATH).
# LLMGW_IMAGE_CACHE: where the root file systems are kept (default ~/.cache/llmgw/image).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
rootfs_only=false
case "${1:-}" in
  --rootfs) rootfs_only=true ;;
  "") ;;
  *) echo "build-image: unknown argument $1 (only --rootfs)" >&2; exit 2 ;;
esac
say() { echo "build-image: $*" >&2; }

# The interpreter: PYTHON, else the tree's virtual environment, else python3. A checkout
# without .venv (llmgw installed as docs/install.md does it, from a wheel) failed with
# ".venv/bin/python: No such file or directory" unless PYTHON was set.
if [ -n "${PYTHON:-}" ]; then
  python=$PYTHON
elif [ -x "$repo/.venv/bin/python" ]; then
  python=$repo/.venv/bin/python
else
  python=$(command -v python3 || true)
  [ -n "$python" ] || { say "there is no $repo/.venv/bin/python and no python3 on the PATH: set PYTHON"; exit 1; }
  say "no PYTHON and no $repo/.venv: using $python, whose installed packages pin the image's dependencies"
fi
"$python" -m pip --version >/dev/null 2>&1 || {
  say "$python has no pip, which builds the image's wheels: apt-get install python3-pip, or set PYTHON to an interpreter with pip (a virtual environment's)"
  exit 1
}
cache=${LLMGW_IMAGE_CACHE:-$HOME/.cache/llmgw/image}
suite=bookworm
mirror=${LLMGW_DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache" "$work/wheels"

# mmdebstrap --mode=root and rootful podman: say so now rather than halfway through.
if [ "$(id -u)" -ne 0 ]; then
  say "building the image needs root (mmdebstrap makes the root file system as root): run it with sudo"
  exit 1
fi
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null 2>&1 || {
    say "$tool is not installed: apt-get install podman runc mmdebstrap (or run scripts/install-test-deps.sh)"
    exit 1
  }
done

# Only the runtime dependencies, at the versions this tree resolved: pip freeze of the
# virtual environment (dev tools included, which a constraint that is never asked for ignores).
# A package installed from a URL (`name @ file://...`) cannot be a constraint: left out.
"$python" -m pip freeze --exclude-editable | grep -v -e '^-e ' -e ' @ ' | grep -iv '^llmgw[= @]' >"$work/constraints.txt"
"$python" -m pip wheel --quiet --no-deps -w "$work/wheels" "$repo" >&2
"$python" -m pip wheel --quiet -c "$work/constraints.txt" -w "$work/wheels" "$work"/wheels/llmgw-*.whl >&2
# pip itself, run from its wheel inside the image, so that the image keeps no pip.
"$python" -m pip download --quiet --no-deps -d "$work/pip" pip >&2
mv "$work"/pip/pip-*.whl "$work/pip/pip.whl"

# A wheel's zip records each file's time, which a fresh checkout changes: the tag hashes contents.
tag=$("$python" - "$work/wheels" "$0" <<'EOF'
import hashlib, sys, zipfile
from pathlib import Path

digest = hashlib.sha256(Path(sys.argv[2]).read_bytes())
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    digest.update(wheel.name.encode())
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + hashlib.sha256(archive.read(name)).digest())
print(digest.hexdigest()[:16])
EOF
)
image=localhost/llmgw:$tag
version=$(basename "$work"/wheels/llmgw-*.whl | cut -d- -f2)
# Where the image came from: the tree's origin and commit, when it is a git checkout.
source=$(git -C "$repo" remote get-url origin 2>/dev/null || echo "file://$repo")
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)

if ! $rootfs_only && podman image exists "$image"; then
  say "$image is built already"
  echo "$image"
  exit 0
fi

rootfs=$cache/$tag.tar
if [ ! -s "$rootfs" ]; then
  say "building the root file system of $image (Debian $suite, mmdebstrap)"
  # Documentation, manual pages and locales are a third of a minimal Debian and nobody
  # reads them in a container; apt's lists would only go stale in the image.
  # /etc/llmgw is the llmgw user's: the chart's server writes its server.yaml there at start,
  # into an empty volume that a container engine gives the image's owner of the directory.
  # The hooks' $1 (the root being built) is mmdebstrap's to expand, not this shell's.
  # shellcheck disable=SC2016
  mmdebstrap --variant=minbase --mode=root --format=tar \
    --include=python3,ca-certificates,tzdata \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='mkdir -p "$1/tmp/build" && cp -r '"$work/wheels $work/pip $work/constraints.txt"' "$1/tmp/build/"' \
    --customize-hook='chroot "$1" python3 -m venv --without-pip /opt/llmgw' \
    --customize-hook='chroot "$1" sh -c "/opt/llmgw/bin/python /tmp/build/pip/pip.whl/pip install --quiet --no-index --no-cache-dir --no-compile --find-links /tmp/build/wheels -c /tmp/build/constraints.txt /tmp/build/wheels/llmgw-*.whl"' \
    --customize-hook='chroot "$1" sh -c "/opt/llmgw/bin/python -m compileall -q -j 0 /opt/llmgw/lib >/dev/null"' \
    --customize-hook='ln -sfn /opt/llmgw/bin/llmgw "$1/usr/local/bin/llmgw"' \
    --customize-hook='chroot "$1" useradd --system --uid 999 --user-group --home-dir /var/lib/llmgw --shell /usr/sbin/nologin llmgw' \
    --customize-hook='mkdir -p "$1/var/lib/llmgw" "$1/etc/llmgw" && chroot "$1" chown llmgw:llmgw /var/lib/llmgw /etc/llmgw' \
    --customize-hook='rm -rf "$1/tmp/build" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    "$suite" "$rootfs.part" "$mirror" >&2
  mv "$rootfs.part" "$rootfs"
  # Only the newest root file system is kept: each is a couple of hundred megabytes.
  find "$cache" -maxdepth 1 -name "*.tar*" ! -name "$tag.tar" -delete
fi

if $rootfs_only; then
  echo "$rootfs"
  exit 0
fi

say "importing $rootfs as $image"
# The user is the image's default; the agent's pod runs it as root (it installs engines).
# The same settings as the Containerfile's (a test holds them equal).
podman import \
  --change 'USER llmgw' \
  --change 'WORKDIR /var/lib/llmgw' \
  --change 'ENV PATH=/opt/llmgw/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
  --change 'ENTRYPOINT ["/opt/llmgw/bin/llmgw"]' \
  --change 'CMD ["--help"]' \
  --change 'EXPOSE 8080/tcp' --change 'EXPOSE 7443/tcp' --change 'EXPOSE 8081/tcp' \
  --change "LABEL org.opencontainers.image.version=$version" \
  --change "LABEL org.opencontainers.image.source=$source" \
  --change "LABEL org.opencontainers.image.revision=$revision" \
  --change 'LABEL org.opencontainers.image.title=llmgw' \
  --change "LABEL org.opencontainers.image.base.name=debian:$suite" \
  "$rootfs" "$image" >&2
podman tag "$image" localhost/llmgw:latest
# Each build of a changed tree is another couple of hundred megabytes in podman's storage:
# older builds go, unless a container still uses one (then podman refuses, and it stays).
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/llmgw:' \
  | grep -v -e ":$tag\$" -e ':latest$' | xargs -r podman rmi >/dev/null 2>&1 || true
echo "$image"
