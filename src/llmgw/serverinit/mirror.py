"""`server init --bundle`: the mirror role the bundle was imported for, ready to start.

An import alone left an offline site half set up: no mirror.yaml for the
mirror role to read (`/etc/llmgw/mirror.yaml: cannot be read`), no
certificates for its admin listener, and no `mirror:` section in
server.yaml, so a catalog model with `source: mirror:…` was refused with "no
mirror is configured". These steps write each, and like the rest of init
they look first: mirror.yaml and server.yaml's mirror keys are never
overwritten, and a certificate already issued is kept.

Paths written into the files are paths of the machine as init sees it (under
its root), as server.yaml's are; blocking throughout, called from a thread.
"""

from __future__ import annotations

import os
import string
import tempfile
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import attrs

from llmgw import config, durable, pki
from llmgw.catalog import load_server_config
from llmgw.config import MirrorConfig, ServerConfig
from llmgw.config.editing import replace_text, with_section
from llmgw.listen import split_host_port
from llmgw.serverinit.system import Account

MIRROR_CERT = "mirror"
CONTROL_PLANE = "control-plane"
MIRROR_SERVICE = "llmgw-mirror"
DEFAULT_PORT = 8081


@attrs.frozen
class Said:
    """One of init's lines: `ok` (changed), `kept` (found done) or `skip` (left to the operator)."""

    verb: str
    what: str


@attrs.frozen
class MirrorSite:
    etc: Path
    pki_dir: Path
    server_yaml: Path
    account: Account
    # Names the mirror's certificate carries besides 127.0.0.1: the control plane's own.
    names: Sequence[str]

    @property
    def mirror_yaml(self) -> Path:
        return self.etc / "mirror.yaml"


def mirror_config(site: MirrorSite, default_root: Path) -> MirrorConfig:
    """mirror.yaml as it is, or as init would write it: what the import places files by."""
    if site.mirror_yaml.is_file():
        return config.load(MirrorConfig, site.mirror_yaml)
    return config.evolve(MirrorConfig(), root=str(default_root), listen=f"0.0.0.0:{DEFAULT_PORT}")


def set_up_mirror(site: MirrorSite, cfg: MirrorConfig, url: str) -> list[Said]:
    """mirror.yaml, the two certificates of the admin listener, and server.yaml's `mirror:`."""
    said = [_mirror_yaml(site, cfg), _own_root(site, Path(cfg.root))]
    cfg = config.load(MirrorConfig, site.mirror_yaml)
    said += _certificates(site, cfg)
    said.append(_server_section(site, cfg, url))
    return said


def run_as(user: str, args: str) -> str:
    """The command, for root on a machine without systemd, that runs `llmgw args` as user.

    setpriv (util-linux, on every Debian, Ubuntu and RHEL-family machine) becomes the user and
    execs llmgw: one process, whose pid Ctrl-C, `kill` or a supervisor signals. `sudo -u` and
    `runuser -u` stay llmgw's parent, a second process, and not every machine has sudo.
    """
    return f"setpriv --reuid={user} --regid={user} --init-groups --reset-env llmgw {args}"


def start_lines(user: str, systemd: bool) -> list[str]:
    """How to start the mirror role, for init's closing list."""
    if systemd:
        return [f"  systemctl status {MIRROR_SERVICE}   # the mirror role, started with the server"]
    return [
        "and the mirror role, which serves the bundle to the nodes:",
        f"  {run_as(user, '--role=mirror --config /etc/llmgw/mirror.yaml')}",
    ]


def _mirror_yaml(site: MirrorSite, cfg: MirrorConfig) -> Said:
    path = site.mirror_yaml
    if path.exists():
        return Said("kept", f"{path} (never overwritten)")
    _, port = split_host_port(cfg.listen, "listen")
    template = (
        resources.files("llmgw.serverinit").joinpath("files", "mirror.yaml").read_text(encoding="utf-8")
    )
    text = string.Template(template).substitute(etc=site.etc, root=cfg.root, port=port)
    _write_private(path, text, site.account)
    return Said("ok", f"{path}: the mirror role's configuration (files for nodes on port {port})")


def _own_root(site: MirrorSite, root: Path) -> Said:
    """The mirror's root given to the service's user: the import wrote it as root, and fetches write there."""
    uid, gid = site.account.uid, site.account.gid
    changed = False
    for directory, _, files in os.walk(root):
        for path in (directory, *(os.path.join(directory, name) for name in files)):
            st = os.lstat(path)
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.lchown(path, uid, gid)
                changed = True
    return Said("ok" if changed else "kept", f"{root}, owned by the mirror role's user")


def _certificates(site: MirrorSite, cfg: MirrorConfig) -> list[Said]:
    ca_cert, ca_key = site.pki_dir / pki.CA_CERT, site.pki_dir / pki.CA_KEY
    wanted = [
        (Path(cfg.admin_tls.cert), Path(cfg.admin_tls.key), "the mirror's admin listener",
         lambda out: pki.issue_server(site.pki_dir, MIRROR_CERT, ["127.0.0.1", *site.names], out)),
        (site.etc / f"{CONTROL_PLANE}.pem", site.etc / f"{CONTROL_PLANE}-key.pem",
         f"the control plane's client certificate for it ({CONTROL_PLANE})",
         lambda out: pki.issue_agent(site.pki_dir, CONTROL_PLANE, out)),
    ]  # fmt: skip
    said: list[Said] = []
    for cert, key, what, issue in wanted:
        if cert.is_file() and key.is_file():
            said.append(Said("kept", f"{cert}, {what}"))
        elif not ca_key.is_file():
            said.append(
                Said(
                    "skip",
                    f"{cert}, {what}: the authority is kept elsewhere; issue it there "
                    "(docs/mirror.md, The admin listener) and copy it and its key here",
                )
            )
        else:
            _issue(issue, cert, key, site.account)
            said.append(Said("ok", f"{cert}, {what}, signed by {ca_cert}"))
    return said


def _issue(issue: Callable[[Path], tuple[Path, Path]], cert: Path, key: Path, account: Account) -> None:
    # Issued beside where they go and moved over, so that a failure halfway
    # never leaves a certificate without its key.
    with tempfile.TemporaryDirectory(dir=cert.parent, prefix=".issue-") as tmp:
        new_cert, new_key = issue(Path(tmp))
        # The mirror and the server run as the llmgw user and must read their keys; nobody else may.
        os.chown(new_key, -1, account.gid)
        new_key.chmod(0o640)
        new_cert.chmod(0o644)
        durable.move_into_place(new_key, key)
        durable.move_into_place(new_cert, cert)


def _server_section(site: MirrorSite, cfg: MirrorConfig, url: str) -> Said:
    """server.yaml's `mirror:`, only the keys it lacks: a catalog's `source: mirror:…` resolves through it."""
    current = load_server_config(site.server_yaml).mirror
    values: dict[str, object] = {}
    if not current.url and url:
        values["url"] = url
    if not current.api and cfg.admin_listen:
        host, port = split_host_port(cfg.admin_listen, "admin_listen")
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        values["api"] = f"https://{host}:{port}"
        values["tls"] = {
            "ca": str(site.etc / "ca.pem"),
            "cert": str(site.etc / f"{CONTROL_PLANE}.pem"),
            "key": str(site.etc / f"{CONTROL_PLANE}-key.pem"),
        }
    if not values:
        return Said("kept", f"mirror: in {site.server_yaml} (never overwritten)")
    text = site.server_yaml.read_text(encoding="utf-8")
    replace_text(site.server_yaml, with_section(ServerConfig, text, str(site.server_yaml), "mirror", values))
    parts = [f"{key} {values[key]}" for key in ("api", "url") if key in values]
    if "tls" in values:
        parts.append(f"tls with {CONTROL_PLANE}.pem")
    return Said("ok", f"mirror: in {site.server_yaml}: {', '.join(parts)}")


def _write_private(path: Path, text: str, account: Account) -> None:
    durable.write_atomically(path, text, 0o640, prepare=lambda tmp: os.chown(tmp, -1, account.gid))
