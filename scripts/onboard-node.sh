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
  --wheel FILE       install llmgw from this wheel, checked by its sha256 on
                     arrival, instead of from the package index (the version
                     this machine runs)
USAGE
    exit 2
}

die() {
    echo "onboard-node.sh: $*" >&2
    exit 1
}

say() { echo "== $*"; }

NODE="" ADDR="" SERVER="" FABRIC="" SSH_USER="" PKI=/etc/llmgw/pki WHEEL=""
while [ $# -gt 0 ]; do
    case "$1" in
    --node) NODE="${2:-}"; shift 2 ;;
    --addr) ADDR="${2:-}"; shift 2 ;;
    --server) SERVER="${2:-}"; shift 2 ;;
    --fabric) FABRIC="${2:-}"; shift 2 ;;
    --ssh-user) SSH_USER="${2:-}"; shift 2 ;;
    --pki) PKI="${2:-}"; shift 2 ;;
    --wheel) WHEEL="${2:-}"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "onboard-node.sh: unknown option $1" >&2; usage ;;
    esac
done
if [ -z "$NODE" ] || [ -z "$ADDR" ] || [ -z "$SERVER" ]; then usage; fi

HERE="$(cd "$(dirname "$0")" && pwd)"
UNIT="$HERE/../systemd/llmgw-agent.service"
[ -f "$UNIT" ] || die "$UNIT is missing: run this from a checkout of llmgw"
[ -r "$PKI/ca-key.pem" ] || die "there is no readable certificate authority in $PKI (run it as root, or give --pki)"
command -v llmgw >/dev/null || die "llmgw is not on PATH here: it issues the node's certificate"
if [ -n "$WHEEL" ]; then
    [ -f "$WHEEL" ] || die "the wheel $WHEEL does not exist"
    case "$WHEEL" in *.whl) ;; *) die "$WHEEL is not a wheel (.whl)" ;; esac
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

# 3. What installs llmgw on the node. The same version as here, so that the
# node and its control plane speak the same protocol.
VERSION="$(llmgw --version | awk '{print $NF}')"
SOURCE="llmgw==$VERSION"
SHA256=""
if [ -n "$WHEEL" ]; then
    cp "$WHEEL" "$WORK/"
    SOURCE="$(basename "$WHEEL")"
    SHA256="$(sha256sum "$WHEEL" | awk '{print $1}')"
fi
cat >"$WORK/install.sh" <<EOF
#!/bin/sh
# Runs on $NODE as root, from the directory onboard-node.sh copied it to.
# DESTDIR, as in make install, puts everything under another root.
set -eu
cd "\$(dirname "\$0")"
D="\${DESTDIR:-}"
command -v python3 >/dev/null || { echo "python3 is not installed on $NODE (apt-get install python3-venv)" >&2; exit 1; }
if [ -n "$SHA256" ]; then
    # A wheel cut short or altered in transit must not become the node's llmgw.
    echo "$SHA256  $SOURCE" | sha256sum -c - >/dev/null 2>&1 || {
        echo "$SOURCE arrived on $NODE with another sha256 than it left with; nothing was installed" >&2
        exit 1
    }
    PACKAGE="\$(pwd)/$SOURCE"
else
    PACKAGE="$SOURCE"
fi
[ -x "\$D/opt/llmgw/bin/pip" ] || python3 -m venv "\$D/opt/llmgw"
"\$D/opt/llmgw/bin/pip" install --quiet --upgrade "\$PACKAGE"
install -d -m 0755 "\$D/usr/local/bin"
ln -sfn /opt/llmgw/bin/llmgw "\$D/usr/local/bin/llmgw"
install -d -m 0755 "\$D/etc/llmgw"
install -m 0644 ca.pem agent.pem "\$D/etc/llmgw/"
install -m 0600 agent-key.pem "\$D/etc/llmgw/"
if [ -f "\$D/etc/llmgw/agent.yaml" ] && ! cmp -s agent.yaml "\$D/etc/llmgw/agent.yaml"; then
    # Somebody's edits (labels, engine paths): kept beside the new file.
    cp "\$D/etc/llmgw/agent.yaml" "\$D/etc/llmgw/agent.yaml.bak"
fi
install -m 0644 agent.yaml "\$D/etc/llmgw/"
install -d -m 0755 "\$D/etc/systemd/system"
install -m 0644 llmgw-agent.service "\$D/etc/systemd/system/"
systemctl daemon-reload
systemctl enable --quiet llmgw-agent
# restart rather than start: onboarding again must pick up the new files.
systemctl restart llmgw-agent
EOF

# 4. Over to the node: a private directory there, the files, the install.
say "copying llmgw $VERSION and the configuration to $TARGET"
REMOTE="$(ssh "${SSH_OPTS[@]}" "$TARGET" 'mktemp -d')"
[ -n "$REMOTE" ] || die "could not make a temporary directory on $TARGET"
scp -q "${SSH_OPTS[@]}" "$WORK"/* "$TARGET:$REMOTE/"
say "installing on $NODE"
# $REMOTE is expanded here on purpose: it is the directory the node gave us.
# shellcheck disable=SC2029
ssh "${SSH_OPTS[@]}" "$TARGET" \
    "if [ \"\$(id -u)\" -eq 0 ]; then sh $REMOTE/install.sh; else sudo sh $REMOTE/install.sh; fi; rc=\$?; rm -rf $REMOTE; exit \$rc" \
    || die "installing on $NODE failed (above is what it said)"

echo
echo "$NODE is onboarded: llmgw-agent is running there and dialling $SERVER."
echo "Watch it join with:"
echo "  llmgw ctl nodes"
echo "and, when it does not, read why on the node:"
echo "  ssh $TARGET journalctl -u llmgw-agent -n 50"
