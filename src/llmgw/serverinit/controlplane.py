"""`llmgw server init`: everything a control plane needs before it can start, in the order it needs it.

Every step looks before it acts and says which it did (`ok …` when it
changed something, `kept …` when it found it done), so running init again
finishes an install that stopped halfway and changes nothing on one that did
not. It never overwrites server.yaml or an authority, never resets an
existing administrator's password, and leaves alone a certificate issued by
an authority kept on another machine.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import shutil
import string
import tempfile
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import attrs

from llmgw import __version__, durable, installed, pki
from llmgw.bundle.importing import ImportOptions, import_bundle
from llmgw.catalog import load_server_config
from llmgw.config import MirrorConfig, ServerConfig
from llmgw.listen import split_host_port
from llmgw.serverinit.mirror import (
    MIRROR_SERVICE,
    MirrorSite,
    mirror_config,
    run_as,
    set_up_mirror,
    start_lines,
)
from llmgw.serverinit.system import Account, InstallError, System
from llmgw.store import Store, open_store
from llmgw.store.catalog import list_models
from llmgw.store.scopes import DEFAULT_PROJECT_ID, Scope, load_hierarchy
from llmgw.store.users import approve_user, ensure_admin, get_user_by_email, list_users, promote_user

SERVICE = "llmgw-server"
_START = "--role=server --config /etc/llmgw/server.yaml"
UNIT_DIR = Path("/etc/systemd/system")
HEALTH_TIMEOUT_S = 30.0
_HEALTH_POLL_S = 0.5
Report = Callable[[str], None]


def unit_text(name: str) -> str:
    """A systemd unit llmgw ships (llmgw-server.service, ...), as installed from the package."""
    return resources.files("llmgw.serverinit").joinpath("files", name).read_text(encoding="utf-8")


def _template() -> str:
    return resources.files("llmgw.serverinit").joinpath("files", "server.yaml").read_text(encoding="utf-8")


def on_machine(root: Path, path: str | Path) -> Path:
    """Where an absolute path of the machine (/etc/llmgw) lies under root."""
    return root / Path(path).relative_to("/")


@attrs.frozen
class InitOptions:
    root: Path = Path("/")
    admin: str | None = None
    # Names and addresses agents dial besides the ones the machine sees of itself.
    hosts: tuple[str, ...] = ()
    # The authority's directory, as a path of the machine; None is <etc>/pki.
    pki: Path | None = None
    user: str = "llmgw"
    health_timeout_s: float = HEALTH_TIMEOUT_S
    # An offline bundle to import into this machine's mirror, and its manifest's sha256.
    bundle: Path | None = None
    bundle_sha256: str = ""
    # Where nodes reach the mirror's files; empty: the mirror role on this machine, at its default port.
    mirror_url: str = ""

    @property
    def etc(self) -> Path:
        return on_machine(self.root, "/etc/llmgw")

    @property
    def state(self) -> Path:
        return on_machine(self.root, "/var/lib/llmgw")

    @property
    def pki_dir(self) -> Path:
        return on_machine(self.root, self.pki) if self.pki is not None else self.etc / "pki"

    @property
    def config_path(self) -> Path:
        return self.etc / "server.yaml"


@attrs.frozen
class InitResult:
    changed: bool
    config: ServerConfig
    # The administrator's generated password, when one was created by this run.
    password: str | None
    # Whether systemd runs the server; False leaves the command to start it by hand.
    running: bool
    health_url: str
    server_addresses: tuple[str, ...]
    # Whether this run made the store (a first install), and the models in the catalog now
    # (server.yaml's and those added with `ctl model add`).
    store_created: bool
    models: int
    # The nodes registered with a server that was running all along; None where not known.
    nodes: int | None
    # Where this llmgw was installed from: what a node is told to install the same llmgw from.
    origin: installed.Origin


async def init_control_plane(opts: InitOptions, system: System, report: Report) -> InitResult:
    """Do each step not yet done; the first to fail raises InstallError, ConfigError or CertificateError."""
    steps = _Steps(opts, system, report)
    cfg = await asyncio.to_thread(steps.prepare)
    if opts.bundle is not None:
        cfg = await asyncio.to_thread(steps.import_bundle)
    password = await steps.store(cfg)
    models = len({m.name for m in cfg.models} | await steps.stored_models(cfg))
    running = await asyncio.to_thread(steps.service)
    url = health_url(cfg)
    nodes: int | None = None
    if running:
        await steps.wait_healthy(url)
        if SERVICE in steps.kept_running:
            # A server this run started or restarted has heard from no node yet: not asked.
            nodes = await system.registered_nodes(admin_url(cfg))
    return InitResult(
        changed=steps.changed,
        config=cfg,
        password=password,
        running=running,
        health_url=url,
        server_addresses=tuple(steps.wanted_names()),
        store_created=steps.store_created,
        models=models,
        nodes=nodes,
        origin=await asyncio.to_thread(installed.origin),
    )


def health_url(cfg: ServerConfig) -> str:
    return f"{_this_machine(cfg.listen, 'listen')}/health"


def admin_url(cfg: ServerConfig) -> str:
    """The admin listener, as this machine reaches it (it listens on loopback by default)."""
    return _this_machine(cfg.admin_listen, "admin_listen")


def _this_machine(listen: str, key: str) -> str:
    """http://HOST:PORT of a listener, as this machine reaches it: a wildcard address is loopback."""
    host, port = split_host_port(listen, key)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def next_steps(result: InitResult, opts: InitOptions) -> list[str]:
    """What to do once init is done: look at the cluster, add a node, add a model."""
    _, agent_port = split_host_port(result.config.agent_listen, "agent_listen")
    dialled = dial_addresses(result.server_addresses, opts.hosts)
    address = next(iter(dialled), "<this machine>")
    if ":" in address:
        address = f"[{address}]"
    lines = [""]
    if result.running:
        lines.append(f"The control plane is running ({result.health_url} answers). Next:")
    else:
        lines += [
            "Start it by hand, as root (there is no systemd here); it is one process, which Ctrl-C or "
            "`kill PID` stops after draining, or a supervisor runs:",
            f"  {run_as(opts.user, _START)}",
        ]
    if opts.bundle is not None:
        lines += start_lines(opts.user, result.running)
    if not result.running:
        lines.append("Then:")
    pki_flag = f" --pki {opts.pki}" if opts.pki is not None else ""
    wheel_flag, wheel_note = _wheel_to_install(result.origin)
    lines += [
        f"  llmgw ctl status        # {_what_status_shows(result)}",
        "  # each node, from this machine (it holds the authority):",
        f"  scripts/onboard-node.sh --node NAME --addr NODE --server {address}:{agent_port}"
        f"{pki_flag}{wheel_flag}",
        *wheel_note,
    ]
    if len(dialled) > 1:
        lines.append(
            f"  # --server: whichever of {', '.join(dialled)} the node reaches (all are in the certificate)"
        )
    if opts.bundle is not None:
        lines.append(
            "  # then a model from the bundle: `source: mirror:REPO@COMMIT` under `models:` (docs/offline.md)"
        )
    lines += [
        "  # then a model: add it under `models:` in /etc/llmgw/server.yaml (docs/install.md, step 4)",
    ]
    return lines


def _what_status_shows(result: InitResult) -> str:
    if result.store_created and not result.models:
        return "no nodes and no models yet, which is right for now"
    if result.nodes is None:
        nodes = "the nodes registered so far"
    else:
        nodes = f"{result.nodes} node{'s' if result.nodes != 1 else ''}" if result.nodes else "no nodes yet"
    models = f"{result.models} model{'s' if result.models != 1 else ''}" if result.models else "no models yet"
    return f"{nodes}, and {models} in the catalog"


def _wheel_to_install(origin: installed.Origin) -> tuple[str, list[str]]:
    """onboard-node.sh's --wheel, and the lines saying why, for an llmgw that is on no package index.

    Without --wheel a node's pip asks the index for llmgw==VERSION, which a version built from a
    checkout is not: "No matching distribution found for llmgw==0.1.0".
    """
    if origin.wheel is not None:
        return f" --wheel {origin.wheel}", [
            "  # --wheel: the wheel this llmgw was installed from; without it the node's pip asks the "
            f"package index for llmgw=={__version__}"
        ]
    if origin.checkout is not None:
        return f" --wheel dist/llmgw-{__version__}-py3-none-any.whl", [
            f"  # --wheel: this llmgw runs from the checkout {origin.checkout}, on no package index; "
            "build its wheel there with `python3 -m pip wheel --no-deps -w dist .`"
        ]
    return "", []


def dial_addresses(names: Sequence[str], hosts: Sequence[str]) -> list[str]:
    """What to tell a node to dial, best first: each --host, then the machine's addresses, then its hostname.

    The hostname comes last because it is the one name nodes most often
    cannot resolve (`cp` on a site without DNS for it), and a suggestion that
    fails on the first node is worse than none.
    """
    wanted = {_normal(host) for host in hosts}

    def rank(name: str) -> int:
        if name in wanted:
            return 0
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return 2
        return 1

    return sorted(names, key=rank)


def _normal(name: str) -> str:
    """IP addresses in their canonical text and DNS names in lower case, so that both compare."""
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.strip().lower().rstrip(".")


@attrs.define
class _Steps:
    opts: InitOptions
    system: System
    report: Report
    changed: bool = False
    account: Account | None = None
    store_created: bool = False
    # The units found running and left so by this run: a server's registry still holds its nodes.
    kept_running: set[str] = attrs.field(factory=set)

    def ok(self, what: str) -> None:
        self.changed = True
        self.report(f"ok    {what}")

    def kept(self, what: str) -> None:
        self.report(f"kept  {what}")

    # -- files: run in a thread ------------------------------------------------

    def prepare(self) -> ServerConfig:
        self._user()
        self._directories()
        self._certificates()
        return self._configuration()

    def _user(self) -> None:
        name = self.opts.user
        account = self.system.lookup_user(name)
        if account is None:
            self.system.create_system_user(name, "/var/lib/llmgw")
            account = self.system.lookup_user(name)
            if account is None:
                raise InstallError(f"useradd reported success but there is still no user {name}")
            self.ok(f"system user {name}")
        else:
            self.kept(f"system user {name}")
        self.account = account

    def _directories(self) -> None:
        assert self.account is not None
        opts = self.opts
        for path, mode, owner in (
            (opts.etc, 0o755, None),
            (opts.state, 0o750, self.account),
            (opts.pki_dir, 0o700, None),
        ):
            existed = path.is_dir()
            path.mkdir(parents=True, exist_ok=True)
            fixed = _ensure_access(path, mode, owner.uid if owner else -1, owner.gid if owner else -1)
            whose = f", owned by {opts.user}" if owner else ""
            if not existed or fixed:
                self.ok(f"{path} ({mode:04o}{whose})")
            else:
                self.kept(f"{path}")

    def wanted_names(self) -> list[str]:
        """Every name an agent could dial: --host first, then the hostname and each address of the machine.

        Asking the operator to list them is how a certificate ends up naming
        the one address nobody uses, found out when the first node refuses it.
        """
        names: list[str] = []
        for name in (*self.opts.hosts, self.system.hostname(), *self.system.addresses()):
            if name and _normal(name) not in names:
                names.append(_normal(name))
        return names

    def _certificates(self) -> None:
        assert self.account is not None
        opts = self.opts
        ca_cert, ca_key = opts.pki_dir / pki.CA_CERT, opts.pki_dir / pki.CA_KEY
        server_cert, server_key = opts.etc / "server.pem", opts.etc / "server-key.pem"
        trusted = opts.etc / "ca.pem"
        have_authority = ca_cert.is_file() and ca_key.is_file()
        if server_cert.is_file() and not (have_authority and pki.is_issued_by(server_cert, ca_cert)):
            # Issued by an authority kept on another machine, which is how
            # anyone who will not keep ca-key.pem on the control plane works.
            # A new authority here would replace it with one no node trusts.
            if opts.hosts:
                raise InstallError(
                    f"{server_cert} was issued by a certificate authority that is not in {opts.pki_dir}, "
                    f"so init cannot add {', '.join(opts.hosts)} to it: reissue it where that authority "
                    "is kept (`llmgw cert issue-server … --host …`), copy it here and run init again, "
                    "or give that authority's directory with --pki"
                )
            self.kept(f"{server_cert}, issued by an authority kept elsewhere")
            if _ensure_access(server_key, 0o640, -1, self.account.gid):
                self.ok(f"{server_key} readable by {opts.user} (0640)")
            return
        if have_authority:
            self.kept(f"certificate authority in {opts.pki_dir}")
        elif ca_cert.exists() or ca_key.exists():
            raise InstallError(
                f"{opts.pki_dir} holds only one of {pki.CA_CERT} and {pki.CA_KEY}: restore the other "
                "from your backup; a new authority would not be trusted by any node the old one signed"
            )
        else:
            pki.init_ca(opts.pki_dir)
            self.ok(f"certificate authority in {opts.pki_dir} (ca-key.pem signs every node: back it up)")
        if not trusted.is_file() or trusted.read_bytes() != ca_cert.read_bytes():
            shutil.copyfile(ca_cert, trusted)
            trusted.chmod(0o644)
            self.ok(f"{trusted}, the authority the server checks nodes against")
        else:
            self.kept(f"{trusted}")
        wanted = self.wanted_names()
        added: list[str] = []
        if server_cert.is_file():
            have = pki.certificate_names(server_cert)
            added = [name for name in wanted if name not in have]
            if not added:
                self.kept(f"server certificate for {', '.join(have)}")
                return
            # The union: an address that worked yesterday is never dropped by adding one today.
            wanted = have + added
        self._issue_server(wanted, server_cert, server_key)
        note = f" (added {', '.join(added)})" if added else ""
        self.ok(f"server certificate for {', '.join(wanted)}{note}")

    def _issue_server(self, names: Sequence[str], cert: Path, key: Path) -> None:
        assert self.account is not None
        common_name = self.system.hostname() or "llmgw-server"
        # Issued beside the old pair and moved over it, so that a failure
        # halfway never leaves a certificate without its key.
        with tempfile.TemporaryDirectory(dir=cert.parent, prefix=".issue-") as tmp:
            new_cert, new_key = pki.issue_server(self.opts.pki_dir, common_name, list(names), Path(tmp))
            # The service runs as the llmgw user and must read its key; nobody else may.
            _ensure_access(new_key, 0o640, -1, self.account.gid)
            new_cert.chmod(0o644)
            durable.move_into_place(new_key, key)
            durable.move_into_place(new_cert, cert)

    def _configuration(self) -> ServerConfig:
        assert self.account is not None
        opts, path = self.opts, self.opts.config_path
        if path.exists():
            self.kept(f"{path} (never overwritten)")
        else:
            text = string.Template(_template()).substitute(
                etc=opts.etc,
                state_dir=opts.state,
                pki=opts.pki_dir,
            )
            gid = self.account.gid
            durable.write_atomically(
                path, text, 0o640, prepare=lambda tmp: _ensure_access(tmp, 0o640, -1, gid)
            )
            self.ok(f"{path}")
        # Checked whether written now or years ago: a file that will not load
        # is better found here than as a unit restarting every two seconds.
        cfg = load_server_config(path)
        for key, address in (
            ("listen", cfg.listen),
            ("admin_listen", cfg.admin_listen),
            ("agent_listen", cfg.agent_listen),
        ):
            split_host_port(address, key)
        pki.server_ssl_context(cfg.tls)
        return cfg

    def import_bundle(self) -> ServerConfig:
        """The bundle checked and placed in this machine's mirror, server.yaml pointed at it, and the
        mirror role set up to serve it."""
        opts = self.opts
        assert opts.bundle is not None and self.account is not None
        site = MirrorSite(
            etc=opts.etc,
            pki_dir=opts.pki_dir,
            server_yaml=opts.config_path,
            account=self.account,
            names=self.wanted_names(),
        )
        mirror = mirror_config(site, on_machine(opts.root, MirrorConfig().root))
        _, port = split_host_port(mirror.listen, "listen")
        # The address nodes reach, as `--server` is suggested: a hostname the control plane
        # knows itself by is one nodes on a site without DNS for it cannot resolve, and every
        # engine install on them would then fail on the mirror's URL.
        address = next(iter(dial_addresses(self.wanted_names(), opts.hosts)), "127.0.0.1")
        url = (
            opts.mirror_url
            or load_server_config(opts.config_path).mirror.url
            or f"http://{f'[{address}]' if ':' in address else address}:{port}"
        )
        done = import_bundle(
            ImportOptions(
                bundle=opts.bundle,
                sha256=opts.bundle_sha256,
                root=Path(mirror.root),
                server_config=opts.config_path,
                mirror_url=url,
                trust_dir=opts.etc / "bundle-keys",
            ),
            lambda line: None,
        )
        signed = f", signed by {done.signer}" if done.signer else ""
        self.ok(
            f"bundle {opts.bundle}{signed}: {len(done.manifest.models)} models and "
            f"{len(done.manifest.engines)} engine releases in the mirror's {mirror.root}"
        )
        if done.engine_base_url:
            self.ok(f"engine_mirror in {opts.config_path}: {done.engine_base_url}")
        for house, wheels in done.wheelhouse_urls():
            self.ok(
                f"{house.label}'s wheels in the mirror: nodes install it with agent.yaml "
                f"`engines.{house.engine}.wheelhouse: {wheels}`"
            )
        for said in set_up_mirror(site, mirror, url):
            if said.verb == "ok":
                self.ok(said.what)
            else:
                self.report(f"{said.verb:<5} {said.what}")
        return load_server_config(opts.config_path)

    # -- the store: async --------------------------------------------------------

    async def store(self, cfg: ServerConfig) -> str | None:
        path = cfg.database_path
        where = cfg.store
        # A PostgreSQL store is kept: its database is made (and owned) by whoever runs PostgreSQL.
        existed = isinstance(where, str) or await asyncio.to_thread(path.exists)
        password: str | None = None
        async with open_store(where) as store:
            if existed:
                self.kept(f"store {store.where}")
            else:
                self.ok(f"store {store.where}")
                self.store_created = True
            await self._default_scopes(store)
            if self.opts.admin:
                password = await self._administrator(store, self.opts.admin)
            else:
                admins = [u.email for u in await list_users(store) if u.is_admin and u.active]
                if admins:
                    self.kept(f"administrator {', '.join(admins)}")
                else:
                    self.report(
                        "skip  no --admin: run init again with --admin EMAIL to create the administrator"
                    )
        if not isinstance(where, str):
            # Created by root, so the service could not write it; given back before it starts.
            await asyncio.to_thread(self._give_store_back, path)
        return password

    async def _default_scopes(self, store: Store) -> None:
        hierarchy = await load_hierarchy(store)
        if DEFAULT_PROJECT_ID not in hierarchy.projects:
            raise InstallError(
                f"the store {store.where} has no default project; it was created by another "
                "version of llmgw — `llmgw --version` on both sides tells which"
            )
        default = hierarchy.name(Scope("project", DEFAULT_PROJECT_ID))
        # The store makes them as it is created: new with a new store, found in an old one.
        if self.store_created:
            self.ok(f"default organisation, team and project: {default}")
        else:
            self.kept(f"default organisation, team and project: {default}")

    async def stored_models(self, cfg: ServerConfig) -> set[str]:
        """The names of the models `ctl model add` put in the store, beside server.yaml's."""
        async with open_store(cfg.store) as store:
            return {m.name for m in await list_models(store)}

    async def _administrator(self, store: Store, email: str) -> str | None:
        password = await ensure_admin(store, email)
        user = await get_user_by_email(store, email)
        assert user is not None
        if user.project_id is None:
            # An account outside every project can sign in and cannot make a key.
            user = await approve_user(store, user.id, DEFAULT_PROJECT_ID)
            if password is None:
                self.ok(f"{email} approved into the default project")
        if not user.is_admin or not user.active:
            user = await promote_user(store, user.id)
            self.ok(f"{email} promoted to administrator; its password is unchanged")
        if password is not None:
            self.ok(f"administrator {email}")
            self.report(f"      password: {password}")
            self.report("      shown this once: sign in at /login and change it on /profile")
        elif user.is_admin:
            self.kept(f"administrator {email}; its password is unchanged")
        return password

    def _give_store_back(self, path: Path) -> None:
        assert self.account is not None
        for suffix in ("", "-wal", "-shm"):
            part = path.with_name(path.name + suffix)
            if part.exists():
                _ensure_access(part, None, self.account.uid, self.account.gid)

    # -- systemd: run in a thread ------------------------------------------------

    def service(self) -> bool:
        if not self.system.has_systemd():
            self.report(
                f"skip  no systemd here: start the server, as root, with `{run_as(self.opts.user, _START)}`"
            )
            return False
        # The mirror first: the server it serves files for is the one init waits on.
        services = ([MIRROR_SERVICE] if self.opts.bundle is not None else []) + [SERVICE]
        for name in services:
            self._install_unit(name)
        for name in services:
            self._run(name)
        return True

    def _install_unit(self, name: str) -> None:
        unit, text = on_machine(self.opts.root, UNIT_DIR / f"{name}.service"), unit_text(f"{name}.service")
        if unit.is_file() and unit.read_text(encoding="utf-8") == text:
            self.kept(f"{unit}")
            return
        note = ""
        if unit.is_file():
            # Somebody's edits, kept: the unit is also where people put
            # environment overrides, and those are not ours to lose.
            shutil.copyfile(unit, unit.with_name(unit.name + ".bak"))
            note = f" (the edited one is kept as {unit.name}.bak)"
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(text, encoding="utf-8")
        unit.chmod(0o644)
        self.ok(f"{unit}{note}")
        self._systemctl("daemon-reload")

    def _run(self, name: str) -> None:
        active = self.system.systemctl("is-active", "--quiet", name).returncode == 0
        enabled = self.system.systemctl("is-enabled", "--quiet", name).returncode == 0
        if not active:
            self._systemctl("enable", "--now", name)
            self.ok(f"{name} enabled and started")
            return
        if not enabled:
            self._systemctl("enable", name)
            self.ok(f"{name} enabled at boot")
        if self.changed:
            # A certificate or a file the running server has not read is one
            # it is not using, and that shows up as a node that cannot connect.
            self._systemctl("restart", name)
            self.ok(f"{name} restarted to read what changed")
        else:
            self.kept(f"{name} running")
            self.kept_running.add(name)

    def _systemctl(self, *args: str) -> None:
        done = self.system.systemctl(*args)
        if done.returncode != 0:
            raise InstallError(f"`systemctl {' '.join(args)}` failed: {done.output or 'no output'}")

    async def wait_healthy(self, url: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.opts.health_timeout_s
        while not await self.system.healthy(url):
            if loop.time() >= deadline:
                raise InstallError(
                    f"{SERVICE} is not answering on {url} after {self.opts.health_timeout_s:.0f} s; "
                    f"`journalctl -u {SERVICE} -n 50` says why"
                )
            await asyncio.sleep(_HEALTH_POLL_S)
        self.report(f"ok    {SERVICE} answers on {url}")


def _ensure_access(path: Path, mode: int | None, uid: int, gid: int) -> bool:
    """Give path this mode and owner (-1 leaves that part); whether anything had to change."""
    st = path.stat()
    changed = False
    if mode is not None and st.st_mode & 0o7777 != mode:
        path.chmod(mode)
        changed = True
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        os.chown(path, uid, gid)
        changed = True
    return changed
