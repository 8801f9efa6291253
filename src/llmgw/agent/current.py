"""The release a node committed to, `<state_dir>/versions/current`, and running it after a restart.

An upgrade execs the agent into `<state_dir>/versions/<V>/` and, once it registers, points
`versions/current` at it (agent/upgrade.py). The process supervisor knows none of that: after a
reboot, or a restart of the unit, it runs the command it was installed with (/usr/local/bin/llmgw),
the release before the upgrade. So an agent that starts from another environment than current
execs into current's interpreter with the same arguments, before any role starts.

Twice guarded against a loop: the exec sets LLMGW_FROM_CURRENT, and an agent that finds it set,
or runs from current already, runs as it is. A current whose llmgw cannot even be imported sends
the agent back (the bootstrap below) with LLMGW_CURRENT_FAILED saying why: the node runs the
release it was started with, and says what to do, rather than start and fail forever.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

import structlog

import llmgw
from llmgw import strictjson
from llmgw.agent import trial

log = structlog.get_logger(__name__)

# Set on the exec into current: {"argv": the command it came from, "pythonpath": its PYTHONPATH}.
FROM_ENV = "LLMGW_FROM_CURRENT"
# Set by the bootstrap when current's llmgw cannot be imported: why.
FAILED_ENV = "LLMGW_CURRENT_FAILED"
# The bootstrap below, as a script in current's bin/, so that the agent's command line reads
# `…/versions/0.2.0/bin/python …/versions/0.2.0/bin/llmgw-current --role=agent --config …` (trial.py).
SCRIPT = "llmgw-current"


def current(state_dir: Path) -> Path:
    return state_dir / "versions" / "current"


def restart_into_current(
    state_dir: Path,
    *,
    version: str = llmgw.__version__,
    prefix: Path = Path(sys.prefix),
    argv: list[str] | None = None,
    env: MutableMapping[str, str] = os.environ,
) -> trial.Restart | None:
    """The command that runs this agent from the release the node committed to; None: run as is.

    argv: this process's command line (sys.argv); env: its environment, from which the guards
    are taken (they are for this start only).
    """
    came_from = env.pop(FROM_ENV, None)
    failed = env.pop(FAILED_ENV, None)
    link = current(state_dir)
    if not link.is_symlink():
        return None  # Never upgraded: the release it was installed with is the one.
    # The agent of a release on trial runs from its own environment until it commits; a trial of
    # another release failed, and is recorded so (rolled back) before the committed one runs.
    _, on_trial = trial.settle(state_dir, version)
    target = link.resolve()
    running = _running_command(argv)
    if on_trial or came_from is not None or prefix.resolve() == target:
        return None
    if failed is not None:
        log.warning(
            f"running llmgw {version} ({running}), not the release this node was upgraded to: "
            f"{target} {failed}; run `llmgw ctl upgrade` for this node again, or remove {link}"
        )
        return None
    if target.name == version:
        return None
    python = target / "bin" / "python"
    if not os.access(python, os.X_OK):
        log.warning(
            f"running llmgw {version} ({running}): {link} points at {target}, which has no "
            f"interpreter (bin/python); run `llmgw ctl upgrade` for this node again, or remove {link}"
        )
        return None
    try:
        bootstrap = trial.script(python, SCRIPT, BOOTSTRAP)
    except OSError as exc:
        log.warning(
            f"running llmgw {version} ({running}): cannot write {python.parent / SCRIPT} to run "
            f"{target}: {exc.strerror or exc}; run `llmgw ctl upgrade` for this node again, or remove {link}"
        )
        return None
    log.info(
        f"running llmgw {target.name} from {target}, the release this node was upgraded to; "
        f"{running} is {version}"
    )
    args = (argv if argv is not None else sys.argv)[1:]
    back = {"argv": trial.previous_command()[0], "pythonpath": env.get("PYTHONPATH")}
    # Without PYTHONPATH: it would put the running release's sources before current's.
    new_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    new_env[FROM_ENV] = strictjson.dumps(back)
    return trial.Restart([str(python), str(bootstrap), *args], new_env)


def _running_command(argv: list[str] | None) -> str:
    first = (argv if argv is not None else sys.argv)[0]
    return "python -m llmgw" if first.endswith("__main__.py") else first


# Run by current's interpreter as SCRIPT, before any of llmgw is imported: only the standard
# library, since what it guards against is current's llmgw failing to import. Without
# LLMGW_FROM_CURRENT (this command line run again later, as an upgrade's way back) it has
# nowhere to go back to, and fails as python would.
BOOTSTRAP = r"""
import json, os, sys
sys.argv = ["llmgw", *sys.argv[1:]]
try:
    from llmgw.cli.main import main
except BaseException as exc:
    came_from = os.environ.pop("LLMGW_FROM_CURRENT", "")
    if not came_from:
        raise
    back = json.loads(came_from)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if back["pythonpath"] is not None:
        env["PYTHONPATH"] = back["pythonpath"]
    env["LLMGW_CURRENT_FAILED"] = "cannot start: %s: %s" % (type(exc).__name__, exc)
    os.execve(back["argv"][0], back["argv"], env)
main()
"""
