#!/usr/bin/env bash
# Onboard a node: issue its certificate from the authority on this machine,
# install llmgw on it over ssh, write its agent.yaml, and start llmgw-agent.
#
# Run it where the authority is (the control plane, after `llmgw server init`).
# The node needs ssh access for --ssh-user (root, or a user with sudo) and
# python3 with venv; it needs no inbound port, since the agent dials out.
set -euo pipefail

usage() {
    cat >&2 <<'USAGE'
usage: onboard-node.sh --node ID --addr HOST --server HOST:PORT[,HOST:PORT...] [options]

  --node ID          the node's id: its certificate's common name, as the control
                     plane will show it (letters, digits, '.', '_', '-')
  --addr HOST        how to reach the machine over ssh
  --server LIST      the control plane's agent service, e.g. 10.0.0.140:7443 (an
                     https:// prefix is accepted); several, comma separated, for a
                     node that fails over between control planes
  --fabric NAME[:HCA,...]
                     the InfiniBand fabric the node is attached to, and optionally
                     its HCAs (default: every HCA it has). Omit for a node with no
                     fabric: it then takes single-node replicas only
  --ssh-user USER    log in as USER (default: ssh's own choice); sudo is used
                     on the node when USER is not root
  --pki DIR          the certificate authority (default /etc/llmgw/pki)
  --wait-ssh SECONDS how long to wait for a machine still booting to answer ssh
                     (default 120; 0 tries once)

  Which llmgw the node gets: always one exact version, by default the one this
  machine runs, from the package index.
  --version V        another version
  --sha256 HEX       the sha256 of llmgw V's wheel: the node downloads the wheel,
                     checks it, and installs only that
  --wheel FILE       install llmgw from this wheel, checked by its sha256 on
                     arrival; its dependencies come from the index, or from
                     --wheelhouse or --mirror
  --wheelhouse DIR   a directory of wheels holding llmgw V and every dependency
                     (a bundle's wheels/): copied to the node, each file checked
                     by its sha256 there, and installed with no index at all
  --mirror URL       a page of links to those wheels on the site's network (pip's
                     --find-links), asked instead of the index
USAGE
    exit 2
}

die() {
    echo "onboard-node.sh: $*" >&2
    exit 1
}

say() { echo "== $*"; }

NODE="" ADDR="" SERVER="" FABRIC="" SSH_USER="" PKI=/etc/llmgw/pki WHEEL="" WHEELHOUSE=""
VERSION="" SHA256="" MIRROR="" WAIT_SSH=120
while [ $# -gt 0 ]; do
    case "$1" in
    --node) NODE="${2:-}"; shift 2 ;;
    --addr) ADDR="${2:-}"; shift 2 ;;
    --server) SERVER="${2:-}"; shift 2 ;;
    --fabric) FABRIC="${2:-}"; shift 2 ;;
    --ssh-user) SSH_USER="${2:-}"; shift 2 ;;
    --pki) PKI="${2:-}"; shift 2 ;;
    --wheel) WHEEL="${2:-}"; shift 2 ;;
    --wheelhouse) WHEELHOUSE="${2:-}"; shift 2 ;;
    --version) VERSION="${2:-}"; shift 2 ;;
    --sha256) SHA256="${2:-}"; shift 2 ;;
    --mirror) MIRROR="${2:-}"; shift 2 ;;
    --wait-ssh) WAIT_SSH="${2:-}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "onboard-node.sh: unknown option $1" >&2; usage ;;
    esac
done
if [ -z "$NODE" ] || [ -z "$ADDR" ] || [ -z "$SERVER" ]; then usage; fi

HERE="$(cd "$(dirname "$0")" && pwd)"
UNIT="$HERE/../systemd/llmgw-agent.service"
INSTALLER="$HERE/onboard-node-install.sh"
[ -f "$UNIT" ] || die "$UNIT is missing: run this from a checkout of llmgw"
[ -f "$INSTALLER" ] || die "$INSTALLER is missing: run this from a checkout of llmgw"
[ -r "$PKI/ca-key.pem" ] || die "there is no readable certificate authority in $PKI (run it as root, or give --pki)"
command -v llmgw >/dev/null || die "llmgw is not on PATH here: it issues the node's certificate"
case "$WAIT_SSH" in '' | *[!0-9]*) die "--wait-ssh takes whole seconds, not '$WAIT_SSH'" ;; esac
# The same version as here unless told otherwise, so that the node and its
# control plane speak the same protocol.
[ -n "$VERSION" ] || VERSION="$(llmgw --version | awk '{print $NF}')"
case "$VERSION" in *[!A-Za-z0-9.+!_-]*) die "'$VERSION' is not a version" ;; esac
SHA256="$(printf '%s' "$SHA256" | tr 'A-F' 'a-f')"
case "$SHA256" in '') ;; *[!0-9a-f]*) die "--sha256 takes 64 hex digits, not '$SHA256'" ;; esac
[ -z "$SHA256" ] || [ "${#SHA256}" -eq 64 ] || die "--sha256 takes 64 hex digits, not '$SHA256'"
case "$MIRROR" in '' | http://* | https://*) ;; *) die "--mirror takes an http:// or https:// URL, not '$MIRROR'" ;; esac
case "$MIRROR" in *"'"*) die "--mirror '$MIRROR' holds a quote" ;; esac
if [ -n "$WHEELHOUSE" ] && [ -n "$MIRROR" ]; then
    die "give --wheelhouse or --mirror, not both: one of them is where the node's wheels come from"
fi
if [ -n "$WHEEL" ]; then
    [ -f "$WHEEL" ] || die "the wheel $WHEEL does not exist"
    case "$WHEEL" in *.whl) ;; *) die "$WHEEL is not a wheel (.whl)" ;; esac
fi
LLMGW_WHEEL=""
if [ -n "$WHEELHOUSE" ]; then
    [ -d "$WHEELHOUSE" ] || die "the wheelhouse $WHEELHOUSE is not a directory (a --tar bundle's wheels are extracted with: tar -xf BUNDLE.tar wheels)"
    if [ -z "$WHEEL" ]; then
        # Wheel names spell the version with '_' for '-' (PEP 427).
        LLMGW_WHEEL="$(find "$WHEELHOUSE" -maxdepth 1 -name "llmgw-${VERSION//-/_}-*.whl" | head -n 1)"
        if [ -z "$LLMGW_WHEEL" ]; then
            HELD="$(find "$WHEELHOUSE" -maxdepth 1 -name 'llmgw-*.whl' -printf '%f ')"
            die "$WHEELHOUSE holds no wheel of llmgw $VERSION (its llmgw wheels: ${HELD:-none}); give --version, or --wheel FILE"
        fi
    fi
fi
TARGET="${SSH_USER:+$SSH_USER@}$ADDR"
# BatchMode: a password prompt nobody answers would hang here forever.
SSH_OPTS=(-o BatchMode=yes -o ConnectTimeout=15)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. The node's identity. Its common name is the node id the control plane
# trusts, so it is issued here, where the authority is, and never on the node.
say "issuing the certificate of $NODE from $PKI"
llmgw cert issue-agent "$NODE" --dir "$PKI" --out "$WORK" >/dev/null
mv "$WORK/$NODE.pem" "$WORK/agent.pem"
mv "$WORK/$NODE-key.pem" "$WORK/agent-key.pem"
cp "$PKI/ca.pem" "$WORK/ca.pem"

# 2. Its configuration: only what the node cannot work out for itself.
{
    echo "# $NODE, written by onboard-node.sh. Every key: docs/reference.md"
    echo "node_id: \"$NODE\""
    # Every control plane, in the order the agent tries them.
    echo "servers:"
    printf '%s\n' "$SERVER" | tr ',' '\n' | sed -e 's/^ *//' -e 's/ *$//' -e 's#^https\?://##' -e 's#/$##' \
        | grep -v '^$' | sed 's/^\(.*\)$/  - "\1"/'
    echo "tls:"
    echo "  ca: /etc/llmgw/ca.pem"
    echo "  cert: /etc/llmgw/agent.pem"
    echo "  key: /etc/llmgw/agent-key.pem"
    if [ -n "$FABRIC" ]; then
        echo "fabric: \"${FABRIC%%:*}\""
        if [ "${FABRIC#*:}" != "$FABRIC" ]; then
            echo "hcas:"
            printf '%s\n' "${FABRIC#*:}" | tr ',' '\n' | grep -v '^$' | sed 's/^\(.*\)$/  - "\1"/'
        fi
    fi
} >"$WORK/agent.yaml"
cp "$UNIT" "$WORK/llmgw-agent.service"

# 3. What installs llmgw on the node, and exactly which llmgw: the version,
# and a digest wherever there is one to check it by.
cp "$INSTALLER" "$WORK/install.sh"
FROM="the package index"
PACKAGE="llmgw==$VERSION"
if [ -n "$WHEEL" ]; then
    cp "$WHEEL" "$WORK/"
    PACKAGE="$(basename "$WHEEL")"
    GOT="$(sha256sum "$WHEEL" | awk '{print $1}')"
    if [ -n "$SHA256" ] && [ "$GOT" != "$SHA256" ]; then
        die "$WHEEL has sha256 $GOT, not the $SHA256 given with --sha256; the node was not touched"
    fi
    SHA256="$GOT"
    FROM="$PACKAGE"
elif [ -n "$LLMGW_WHEEL" ]; then
    PACKAGE="$(basename "$LLMGW_WHEEL")"
    GOT="$(sha256sum "$LLMGW_WHEEL" | awk '{print $1}')"
    if [ -n "$SHA256" ] && [ "$GOT" != "$SHA256" ]; then
        die "$LLMGW_WHEEL has sha256 $GOT, not the $SHA256 given with --sha256; the node was not touched"
    fi
    SHA256=""
fi
if [ -n "$WHEELHOUSE" ]; then
    # Every wheel, dependencies too, is checked on the node before pip sees it:
    # a wheelhouse copied from a carried bundle is the one place they come from.
    mkdir "$WORK/wheelhouse"
    find "$WHEELHOUSE" -maxdepth 1 -type f -name '*.whl' -exec cp {} "$WORK/wheelhouse/" \;
    (cd "$WORK/wheelhouse" && sha256sum ./*.whl >../wheelhouse.sha256)
    FROM="the wheelhouse $WHEELHOUSE, every file checked by its sha256 on $NODE"
elif [ -n "$MIRROR" ]; then
    FROM="$MIRROR"
fi
{
    echo "NODE='$NODE'"
    echo "VERSION='$VERSION'"
    echo "PACKAGE='$PACKAGE'"
    echo "SHA256='$SHA256'"
    echo "MIRROR='$MIRROR'"
} >"$WORK/settings"

# 4. Over to the node. A machine just booted answers ssh only after a while:
# waiting here is what saves a person from running the script again by hand.
DEADLINE=$((SECONDS + WAIT_SSH))
WAITING=""
until ERR="$(ssh "${SSH_OPTS[@]}" "$TARGET" true 2>&1)"; do
    case "$ERR" in
    *"Permission denied"* | *"Host key verification failed"*)
        # A booting machine refuses no one: this will not change by waiting.
        die "$TARGET answers ssh but will not let us in: $ERR" ;;
    esac
    [ "$SECONDS" -lt "$DEADLINE" ] || die "$TARGET did not answer ssh within $WAIT_SSH s (--wait-ssh): ${ERR:-ssh failed}"
    [ -n "$WAITING" ] || say "$TARGET does not answer ssh yet (${ERR:-ssh failed}); waiting up to $WAIT_SSH s"
    WAITING=1
    sleep 1
done
say "copying llmgw $VERSION ($FROM) and the configuration to $TARGET"
REMOTE="$(ssh "${SSH_OPTS[@]}" "$TARGET" 'mktemp -d')"
[ -n "$REMOTE" ] || die "could not make a temporary directory on $TARGET"
scp -q -r "${SSH_OPTS[@]}" "$WORK"/* "$TARGET:$REMOTE/"
say "installing on $NODE"
# $REMOTE is expanded here on purpose: it is the directory the node gave us.
# shellcheck disable=SC2029
ssh "${SSH_OPTS[@]}" "$TARGET" \
    "if [ \"\$(id -u)\" -eq 0 ]; then sh $REMOTE/install.sh; else sudo sh $REMOTE/install.sh; fi; rc=\$?; rm -rf $REMOTE; exit \$rc" \
    && RC=0 || RC=$?
case "$RC" in
0)
    echo
    echo "$NODE is onboarded: llmgw-agent is running there and dialling $SERVER."
    echo "Watch it join with:"
    echo "  llmgw ctl nodes"
    echo "and, when it does not, read why on the node:"
    echo "  ssh $TARGET journalctl -u llmgw-agent -n 50"
    ;;
10)
    echo
    echo "$NODE has llmgw $VERSION and its configuration, but its agent is not running:"
    echo "start it on the node with the command above. Then watch it join with:"
    echo "  llmgw ctl nodes"
    ;;
*) die "installing on $NODE failed (what it said is above)" ;;
esac
