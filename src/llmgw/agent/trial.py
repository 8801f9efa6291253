"""An agent on trial after an upgrade: the marker in state_dir, the commit, and the way back.

The agent that installs a release writes `<state_dir>/upgrade.json` ("on trial: to 0.12.0
from 0.11.2, the previous command line, started at T") and restarts into the new environment
with exec: the same pid, so the engines it started stay its children and are adopted. The new
agent commits when it registers with the control plane. Until then the previous environment is
one exec away, whatever goes wrong:

- the new release cannot even be imported: the bootstrap below, which runs in the new
  interpreter before llmgw and needs nothing but the standard library, writes why and execs
  back;
- it starts but does not register within the bound (the control plane refuses it, it hangs):
  the new agent writes why and execs back itself (agent/upgrade.py);
- it dies some other way and a process supervisor starts the unit again: that runs the
  previous environment, which finds the marker still on trial for another version and says
  the new one stopped before it registered.

The previous agent then reports "rolled back from V: why", and the control plane's roll stops.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import attrs

from llmgw import durable, strictjson
from llmgw.proto.llmgw import v1 as pb

MARKER = "upgrade.json"
# The variable that tells the bootstrap where the marker is; it is removed before llmgw runs.
TRIAL_ENV = "LLMGW_UPGRADE_TRIAL"
# The bootstrap below, as a script beside the new environment's `llmgw`: `ps` and `pgrep -f` read
# `…/versions/0.2.0/bin/python …/versions/0.2.0/bin/llmgw-trial --role=agent --config
# /etc/llmgw/agent.yaml`, where `python -c` put thirty lines of bootstrap before the role and config.
TRIAL_SCRIPT = "llmgw-trial"

TRIAL = "trial"
UPGRADED = "upgraded"
ROLLED_BACK = "rolled back"
# The last upgrade was refused, nothing installed (a digest that did not match): kept to be said.
REFUSED = "refused"


@attrs.define
class Marker:
    """The last upgrade of this node, as `<state_dir>/upgrade.json` holds it."""

    to: str
    from_version: str
    # TRIAL, UPGRADED, ROLLED_BACK or REFUSED.
    state: str
    detail: str = ""
    # The command line of the agent before the upgrade, and its PYTHONPATH (None: it had none).
    previous: list[str] = attrs.field(factory=list)
    previous_pythonpath: str | None = None
    # When the previous agent started the restart (time.time()), and how long the new one has to
    # register before it goes back.
    started: float = 0.0
    trial_s: float = 60.0

    def status(self) -> pb.UpgradeStatus:
        return pb.UpgradeStatus(
            version=self.to, state=self.state, detail=self.detail, from_version=self.from_version
        )


@attrs.frozen
class Restart:
    """The command this process execs into once its roles have stopped (cli/serve.py)."""

    argv: list[str]
    env: dict[str, str]


def read(state_dir: Path) -> Marker | None:
    """The marker in state_dir; None when there is none, or it cannot be read (then nothing is on trial)."""
    try:
        data = json.loads((state_dir / MARKER).read_text())
        return Marker(**data)
    except (OSError, ValueError, TypeError):
        return None


def write(state_dir: Path, marker: Marker) -> None:
    """Replace the marker whole: a crash mid-write must not leave half a command line to exec."""
    state_dir.mkdir(parents=True, exist_ok=True)
    durable.write_atomically(state_dir / MARKER, strictjson.dumps(attrs.asdict(marker)))


def settle(state_dir: Path, version: str) -> tuple[Marker | None, bool]:
    """The marker an agent of version finds as it starts, and whether that agent is on trial.

    A marker on trial for another version means the new agent stopped before it registered, and
    before it could say why (a process supervisor started this, the previous environment, again).
    """
    marker = read(state_dir)
    if marker is None or marker.state != TRIAL:
        return marker, False
    if marker.to == version:
        return marker, True
    marker = attrs.evolve(
        marker,
        state=ROLLED_BACK,
        detail=marker.detail or f"the agent of {marker.to} stopped before it registered",
    )
    write(state_dir, marker)
    return marker, False


def back_to_previous(marker: Marker) -> Restart:
    """The command that runs the agent as it was before the upgrade."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", TRIAL_ENV)}
    if marker.previous_pythonpath is not None:
        env["PYTHONPATH"] = marker.previous_pythonpath
    return Restart(list(marker.previous), env)


def into(python: Path, state_dir: Path) -> Restart:
    """The command that runs this agent, with the same arguments, on python under the bootstrap.

    The bootstrap is written as a script beside python first (blocking: in a thread). PYTHONPATH
    is left behind: it would put the running release's sources before the new one.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env[TRIAL_ENV] = str(state_dir / MARKER)
    return Restart([str(python), str(script(python, TRIAL_SCRIPT, BOOTSTRAP)), *sys.argv[1:]], env)


def script(python: Path, name: str, text: str) -> Path:
    """text as the script name in python's bin/, whole on disk (blocking: in a thread); its path.

    Run as `python SCRIPT ARGS…`, the agent's command line reads as its own does; the script's
    directory first on sys.path is what the environment's own `llmgw` script has too.
    """
    path = python.parent / name
    durable.write_atomically(path, text, 0o755)
    return path


def previous_command() -> tuple[list[str], str | None]:
    """This process's own command line and PYTHONPATH, to come back to."""
    return [sys.executable, *sys.orig_argv[1:]], os.environ.get("PYTHONPATH")


def started_ago(marker: Marker) -> float:
    return max(0.0, time.time() - marker.started)


# Run by the new interpreter as TRIAL_SCRIPT, before any of llmgw is imported: only the standard
# library, since what it guards against is the new llmgw failing to import. Run again without
# LLMGW_UPGRADE_TRIAL (an agent's command line to come back to), it is llmgw itself.
BOOTSTRAP = r"""
import json, os, sys
marker = os.environ.pop("LLMGW_UPGRADE_TRIAL", "")
sys.argv = ["llmgw", *sys.argv[1:]]

def back(why):
    with open(marker) as f:
        m = json.load(f)
    if m.get("state") != "trial":
        raise
    m["state"], m["detail"] = "rolled back", why
    # As llmgw.durable does it, which this cannot import: the bytes, the rename, then the directory.
    with open(marker + ".part", "w") as f:
        # Plain json: this runs where llmgw itself may not import; the marker holds no floats.
        json.dump(m, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(marker + ".part", marker)
    d = os.open(os.path.dirname(marker) or ".", os.O_RDONLY)
    os.fsync(d)
    os.close(d)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if m.get("previous_pythonpath") is not None:
        env["PYTHONPATH"] = m["previous_pythonpath"]
    sys.stderr.write("llmgw: going back to the previous agent: " + why + "\n")
    sys.stderr.flush()
    os.execve(m["previous"][0], m["previous"], env)

try:
    from llmgw.cli.main import main
except BaseException as exc:
    if not marker:
        raise
    back("the new agent cannot start: %s: %s" % (type(exc).__name__, exc))
try:
    main()
except SystemExit as exc:
    if marker and exc.code not in (0, None):
        back("the new agent exited with status %s before it registered" % exc.code)
    raise
"""
