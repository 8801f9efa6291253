#!/bin/sh
# Runs on the node, as root, from the private directory onboard-node.sh copied
# it to with the node's files and `settings` (NODE, VERSION, PACKAGE, SHA256,
# MIRROR). Not for running by hand: use scripts/onboard-node.sh.
#
# Exit 0: installed and llmgw-agent restarted; 10: installed, but there is no
# systemd to start it with (the command to run is printed); anything else:
# nothing new is left in /opt/llmgw.
#
# DESTDIR, as in make install, puts everything under another root (the tests).
set -eu
cd "$(dirname "$0")"
HERE="$(pwd)"
D="${DESTDIR:-}"
NODE="" VERSION="" PACKAGE="" SHA256="" MIRROR=""
# shellcheck source=/dev/null
. ./settings

command -v python3 >/dev/null || {
    echo "python3 is not installed on $NODE (apt-get install python3-venv); nothing was installed" >&2
    exit 1
}

# 1. The checks that need nothing installed: a file changed on the way must
# not become the node's llmgw.
if [ -f wheelhouse.sha256 ]; then
    (cd wheelhouse && sha256sum -c --quiet ../wheelhouse.sha256 >/dev/null 2>&1) || {
        echo "the wheelhouse arrived on $NODE with files whose sha256 is not what they left with:" >&2
        (cd wheelhouse && sha256sum -c --quiet ../wheelhouse.sha256 2>&1 | sed 's/^/  /' >&2) || true
        echo "nothing was installed" >&2
        exit 1
    }
fi
if [ -f "$PACKAGE" ] && [ -n "$SHA256" ]; then
    echo "$SHA256  $PACKAGE" | sha256sum -c - >/dev/null 2>&1 || {
        echo "$PACKAGE arrived on $NODE with another sha256 than it left with; nothing was installed" >&2
        exit 1
    }
fi

# 2. llmgw into /opt/llmgw. A venv cannot be built elsewhere and moved (its
# scripts name their own path), so one made here is removed again if the
# install fails: a half-made /opt/llmgw is what the next person trips on.
VENV="$D/opt/llmgw"
MADE=""
cleanup() {
    rc=$?
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 10 ] && [ -n "$MADE" ]; then
        rm -rf "$VENV"
        echo "removed the /opt/llmgw this install had begun on $NODE" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
if [ ! -x "$VENV/bin/pip" ]; then
    [ -e "$VENV" ] || MADE=1
    python3 -m venv "$VENV" || {
        echo "python3 on $NODE could not make a virtual environment (apt-get install python3-venv)" >&2
        exit 1
    }
fi
# Where the dependencies come from: the copied wheelhouse, the site's mirror,
# or else the package index.
if [ -d wheelhouse ]; then
    set -- --no-index --find-links "$HERE/wheelhouse"
    WHERE="the wheelhouse"
elif [ -n "$MIRROR" ]; then
    set -- --no-index --find-links "$MIRROR"
    WHERE="$MIRROR"
else
    set --
    WHERE="the package index"
fi
pip_failed() {
    sed 's/^/  pip: /' pip.log >&2
    echo "llmgw $VERSION could not be installed on $NODE from $WHERE (pip's words above)." >&2
    if [ ! -f "$PACKAGE" ] && grep -Eqi "(no matching distribution found for|satisfies the requirement) llmgw([ =<>(]|$)" pip.log; then
        # llmgw itself is what the index lacks, not a dependency: a version built from a checkout
        # is on no index, whatever the node's network.
        echo "The index has no llmgw $VERSION: a version built from a checkout is on none." \
            "Give its wheel with --wheel FILE (python3 -m pip wheel --no-deps -w dist . in the" \
            "checkout; docs/install.md, step 1), or --wheelhouse DIR (a bundle's wheels/)." >&2
    elif [ "$WHERE" = "the package index" ]; then
        echo "A node that cannot reach the index installs from a wheelhouse instead: --wheelhouse DIR" \
            "(a bundle's wheels/) or --mirror URL; see docs/offline.md." >&2
    else
        echo "It must hold llmgw and every dependency, built for this node's Python and machine" \
            "(llmgw bundle create --arch; see docs/offline.md)." >&2
    fi
    exit 1
}
if [ -n "$SHA256" ] && [ ! -f "$PACKAGE" ]; then
    # From an index or a mirror: the wheel itself first, checked, then only it.
    mkdir download
    "$VENV/bin/pip" download --quiet --no-deps --only-binary=:all: --dest download "$@" "$PACKAGE" \
        >pip.log 2>&1 || pip_failed
    for wheel in download/*.whl; do
        got="$(sha256sum "$wheel" | awk '{print $1}')"
        [ "$got" = "$SHA256" ] || {
            echo "$WHERE served $(basename "$wheel") with sha256 $got, not the $SHA256 given with --sha256;" \
                "nothing was installed" >&2
            exit 1
        }
        PACKAGE="$wheel"
    done
fi
if [ -f "$PACKAGE" ]; then PACKAGE="$HERE/$PACKAGE"; fi
if [ -d wheelhouse ] && [ -f "wheelhouse/$PACKAGE" ]; then PACKAGE="$HERE/wheelhouse/$PACKAGE"; fi
"$VENV/bin/pip" install --quiet --upgrade "$@" "$PACKAGE" >pip.log 2>&1 || pip_failed
MADE=""

# 3. Its identity, configuration and unit.
install -d -m 0755 "$D/usr/local/bin"
ln -sfn /opt/llmgw/bin/llmgw "$D/usr/local/bin/llmgw"
install -d -m 0755 "$D/etc/llmgw"
install -m 0644 ca.pem agent.pem "$D/etc/llmgw/"
install -m 0600 agent-key.pem "$D/etc/llmgw/"
if [ -f "$D/etc/llmgw/agent.yaml" ] && ! cmp -s agent.yaml "$D/etc/llmgw/agent.yaml"; then
    # Somebody's edits (labels, engine paths): kept beside the new file.
    cp "$D/etc/llmgw/agent.yaml" "$D/etc/llmgw/agent.yaml.bak"
fi
install -m 0644 agent.yaml "$D/etc/llmgw/"
install -d -m 0755 "$D/etc/systemd/system"
install -m 0644 llmgw-agent.service "$D/etc/systemd/system/"

# 4. Started by systemd, or the command that would, in words. A container or
# a chroot has systemctl installed more often than it has systemd running.
STARTED=0
if command -v systemctl >/dev/null && [ -d "$D/run/systemd/system" ]; then
    systemctl daemon-reload
    systemctl enable --quiet llmgw-agent
    # restart rather than start: onboarding again must pick up the new files.
    systemctl restart llmgw-agent
    STARTED=1
else
    echo "== there is no systemd on $NODE (no /run/systemd/system), so llmgw-agent was not started."
    echo "   Start it there as root, as its unit would, and keep it running (tmux, your supervisor):"
    echo "     $(sed -n 's/^ExecStart=//p' llmgw-agent.service)"
fi

# 5. What the node's engines look like now. Not a reason to fail: the agent
# installs the engines its models need once it has joined.
echo "== the engine checks on $NODE (llmgw ctl engine-check):"
[ -x "$D/opt/llmgw/bin/llmgw" ] || echo "   none: the installed llmgw has no /opt/llmgw/bin/llmgw to run them"
[ ! -x "$D/opt/llmgw/bin/llmgw" ] || for engine in llamacpp vllm sglang; do
    if "$D/opt/llmgw/bin/llmgw" ctl engine-check "$engine" >check.log 2>&1; then
        echo "   $engine: $(tail -n 1 check.log)"
    else
        case $? in
        4) echo "   $engine: not installed yet (the agent installs it when a model needs it)" ;;
        *) echo "   $engine: $(grep -v '^$' check.log | tail -n 1)" ;;
        esac
    fi
done
[ "$STARTED" -eq 1 ] || exit 10
