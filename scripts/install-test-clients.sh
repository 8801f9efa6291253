#!/usr/bin/env bash
# Install the command-line agents the client tests (tests/clients) drive through the gateway:
# Claude Code and Codex CLI, from the npm registry, at the versions tests/clients/package-lock.json
# pins (with their digests), into a cache of this user's: ${LLMGW_CLIENTS_CACHE:-~/.cache/llmgw/clients}.
#
# `make test` runs it before the tests (as any user: nothing is installed system-wide), and
# tests/needs.py finds the programs there. With the pinned versions installed it does nothing and
# reaches no network. Both ship native programs in per-platform packages of the same registry
# (@anthropic-ai/claude-code-linux-x64, @openai/codex-linux-x64); Claude Code's postinstall
# copies its own over the placeholder `claude`, so install scripts must be allowed to run.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
pins="$here/tests/clients"
cache="${LLMGW_CLIENTS_CACHE:-$HOME/.cache/llmgw/clients}"

if ! command -v npm >/dev/null 2>&1; then
  echo "install-test-clients: npm is not installed (Debian's nodejs and npm packages):" \
    "run scripts/install-test-deps.sh as root" >&2
  exit 1
fi

# Installed already: the same lock file, and each program answering --version with its pin.
installed() {
  cmp -s "$pins/package-lock.json" "$cache/package-lock.json" || return 1
  "$cache/node_modules/.bin/claude" --version 2>/dev/null | grep -qF "$(pin @anthropic-ai/claude-code) (Claude Code)" || return 1
  "$cache/node_modules/.bin/codex" --version 2>/dev/null | grep -qxF "codex-cli $(pin @openai/codex)" || return 1
}

pin() {
  node -e 'process.stdout.write(require(process.argv[1]).dependencies[process.argv[2]])' \
    "$pins/package.json" "$1"
}

# Neither program may reach the network when asked its version.
export DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1

if installed; then
  exit 0
fi
echo "install-test-clients: installing Claude Code $(pin @anthropic-ai/claude-code) and Codex CLI" \
  "$(pin @openai/codex) into $cache (about 250 MB from the npm registry)" >&2
mkdir -p "$cache"
cp "$pins/package.json" "$pins/package-lock.json" "$cache/"
npm ci --prefix "$cache" --no-audit --no-fund --loglevel=error >&2
if ! installed; then
  echo "install-test-clients: installed into $cache, but \`claude --version\` or \`codex --version\`" \
    "does not answer with the pinned version; see $cache/node_modules/.bin" >&2
  exit 1
fi
