"""`llmgw bundle`: what an offline site needs, collected where there is internet and imported where not."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from llmgw import config, installed
from llmgw.bundle import signing
from llmgw.bundle.create import (
    ARCHES,
    CreateOptions,
    create_bundle,
    default_llmgw_spec,
    parse_arches,
    parse_engines,
)
from llmgw.bundle.importing import ImportOptions, import_bundle, node_packages
from llmgw.bundle.manifest import BundleError
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.config import MirrorConfig
from llmgw.download import human_bytes
from llmgw.errors import ConfigError, LlmgwError
from llmgw.mirror.fetch import read_token

DEFAULT_MIRROR_CONFIG = Path("/etc/llmgw/mirror.yaml")
DEFAULT_SERVER_CONFIG = Path("/etc/llmgw/server.yaml")
_TRUST_DIR_HELP = "The directory of trusted public keys."


@click.group()
def bundle() -> None:
    """Offline sites: collect what a cluster downloads into one checked bundle, and import it."""


def _fail(exc: LlmgwError) -> None:
    click.echo(f"llmgw: {exc}", err=True)
    sys.exit(EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_ERROR)


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@bundle.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option(
    "--models",
    multiple=True,
    metavar="REPO[@REVISION]",
    help="A model to carry, pinned to the "
    "commit its revision names; repeatable, or several separated by commas.",
)
@click.option(
    "--engines",
    multiple=True,
    metavar="ENGINE=VERSION",
    help="An engine release to carry, such as llamacpp=b11434 (its archives for each --arch with the "
    "publisher's digests) or vllm=0.32.0 (every wheel of the lock llmgw ships for it).",
)
@click.option(
    "--arch",
    "arch",
    default=",".join(ARCHES),
    show_default=True,
    metavar="ARCH,…",
    help="The nodes' architectures, of x64 and arm64.",
)
@click.option(
    "--cpu-only",
    is_flag=True,
    help="Leave out the CUDA builds (hundreds of megabytes each) for a site with no NVIDIA node.",
)
@click.option("--tar", is_flag=True, help="Write OUT as one uncompressed tar instead of a directory.")
@click.option(
    "--wheelhouse",
    type=click.Path(path_type=Path, file_okay=False),
    help="Copy the wheels in this directory (llmgw's own among them) instead of asking pip for them.",
)
@click.option(
    "--index-url",
    default="",
    metavar="URL",
    help="The package index an engine's locked wheels (vLLM's) come from, instead of pip's own "
    "configuration and the lock's extra indexes (PyTorch's).",
)
@click.option(
    "--llmgw",
    "llmgw_spec",
    metavar="SPEC",
    help="What pip builds llmgw's wheel from: a version pin, a source directory or a wheel "
    "[default: this llmgw: its checkout when it runs from one, the wheel file it was installed from, "
    "else llmgw==VERSION].",
)
@click.option(
    "--hf-endpoint",
    default="https://huggingface.co",
    show_default=True,
    metavar="URL",
    help="The Hugging Face–compatible hub the models come from.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="The file holding the "
    "hub's access token, for gated models [default: HF_TOKEN from the environment].",
)
@click.option(
    "--release-api",
    default="https://api.github.com",
    show_default=True,
    metavar="URL",
    help="The release API the engines' digests come from.",
)
@click.option(
    "--release-download",
    default="https://github.com",
    show_default=True,
    metavar="URL",
    help="Where the engines' release archives are downloaded from.",
)
def create(
    out: Path,
    models: tuple[str, ...],
    engines: tuple[str, ...],
    arch: str,
    cpu_only: bool,
    tar: bool,
    wheelhouse: Path | None,
    index_url: str,
    llmgw_spec: str | None,
    hf_endpoint: str,
    token_file: Path | None,
    release_api: str,
    release_download: str,
) -> None:
    """Collect llmgw's wheels, the engines' archives (or vLLM's locked wheels) and the models into OUT.

    The manifest's sha256 is printed last.

    Carry the sha256 apart from the bundle (a message, a ticket): `llmgw bundle import` refuses a
    bundle whose manifest does not have it.
    """
    try:
        opts = CreateOptions(
            out=out.absolute(),
            models=tuple(_split(models)),
            engines=parse_engines(_split(engines)),
            arches=parse_arches(arch),
            cpu_only=cpu_only,
            tar=tar,
            wheelhouse=wheelhouse,
            index_url=index_url,
            hf_endpoint=hf_endpoint,
            hf_token=read_token(str(token_file) if token_file is not None else ""),
            release_api=release_api,
            release_download=release_download,
            llmgw_spec=llmgw_spec or default_llmgw_spec(installed.origin()),
        )
        created = asyncio.run(create_bundle(opts, lambda line: click.echo(line, err=True)))
    except LlmgwError as exc:
        _fail(exc)
        return
    m = created.manifest
    click.echo(
        f"bundle {created.path}: {len(m.files)} files, {human_bytes(m.size, None)} "
        f"({len(m.models)} models, {len(m.engines)} engine releases"
        + (f", {len(m.wheelhouses)} engine wheelhouses)" if m.wheelhouses else ")")
    )
    click.echo(f"manifest sha256: {created.sha256}")


@bundle.command(name="import")
@click.argument("path", metavar="BUNDLE", type=click.Path(path_type=Path))
@click.option(
    "--sha256",
    "sha256",
    required=True,
    metavar="HEX",
    help="The manifest's sha256, as `llmgw bundle create` printed it, carried apart from the bundle.",
)
@click.option(
    "--mirror-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_MIRROR_CONFIG,
    show_default=True,
    help="The mirror's configuration, whose root the bundle fills; the "
    "defaults when this default file does not exist.",
)
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), help="Override the mirror's root.")
@click.option(
    "--server-config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_SERVER_CONFIG,
    show_default=True,
    help="The control plane's server.yaml, whose engine_mirror is set "
    "to the mirror and the engines' digests.",
)
@click.option(
    "--mirror-url",
    metavar="URL",
    default="",
    help="Where nodes reach the mirror's files "
    "(http://models.internal:8081) [default: server.yaml's mirror.url].",
)
@click.option(
    "--trust-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=signing.DEFAULT_TRUST_DIR,
    show_default=True,
    help=_TRUST_DIR_HELP,
)
@click.option(
    "--allow-unsigned", is_flag=True, help="Import an unsigned bundle even though keys are trusted."
)
def import_(
    path: Path,
    sha256: str,
    mirror_config: Path,
    root: Path | None,
    server_config: Path,
    mirror_url: str,
    trust_dir: Path,
    allow_unsigned: bool,
) -> None:
    """Check BUNDLE whole, then fill the mirror with its models and engines and point server.yaml at them.

    Nothing is placed unless every file matches the manifest, the manifest its --sha256, and its
    signature a trusted key.
    """
    try:
        if root is None:
            cfg = (
                MirrorConfig()
                if mirror_config == DEFAULT_MIRROR_CONFIG and not mirror_config.exists()
                else config.load(MirrorConfig, mirror_config)
            )
            root = Path(cfg.root)
        opts = ImportOptions(
            bundle=path,
            sha256=sha256,
            root=root,
            server_config=server_config,
            mirror_url=mirror_url,
            trust_dir=trust_dir,
            allow_unsigned=allow_unsigned,
        )
        done = import_bundle(opts, lambda line: click.echo(line, err=True))
    except LlmgwError as exc:
        _fail(exc)
        return
    m = done.manifest
    signed = f"signed by {done.signer}" if done.signer else "unsigned"
    click.echo(f"imported {path} ({signed}): {len(m.files)} files, {human_bytes(m.size, None)}")
    for model in m.models:
        click.echo(f"  model  {model.repo}@{model.commit}  (source: mirror:{model.repo}@{model.commit})")
    for engine in m.engines:
        click.echo(f"  engine {engine.engine} {engine.version} for {', '.join(engine.arch)}")
    for house in m.wheelhouses:
        machine = f" for {house.machine}" if house.machine else ""
        click.echo(f"  engine {house.label}{machine}: the wheels of its lock")
    if done.engine_base_url:
        click.echo(
            f"engine_mirror.base_url is {done.engine_base_url}; restart the server to send it to the nodes"
        )
    for house, url in done.wheelhouse_urls():
        click.echo(
            f"nodes install {house.label} from the mirror with agent.yaml "
            f"`engines.{house.engine}.wheelhouse: {url}`"
        )
    packages = node_packages(m)
    if packages:
        click.echo(
            f"nodes also need the OS packages {' or '.join(packages)}, which no bundle carries: "
            "install them from the site's own package mirror, or into the nodes' image, before "
            "their engines install"
        )


@bundle.command()
@click.argument("path", metavar="BUNDLE", type=click.Path(path_type=Path, exists=True))
@click.option(
    "--key",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The ed25519 private key to sign with (`llmgw bundle keygen`).",
)
def sign(path: Path, key: Path) -> None:
    """Sign BUNDLE's manifest, so that sites trusting KEY's public half import it."""
    try:
        private = signing.load_private(key)
        signing.sign_bundle(path, private)
    except LlmgwError as exc:
        _fail(exc)
        return
    click.echo(f"signed {path} with {signing.fingerprint(private.public_key())}")


@bundle.command()
@click.argument("path", metavar="KEYFILE", type=click.Path(path_type=Path, dir_okay=False))
def keygen(path: Path) -> None:
    """Make an ed25519 signing key: KEYFILE (private, 0600; keep it off the sites) and KEYFILE.pub."""
    try:
        public = signing.generate(path)
        fingerprint = signing.fingerprint(signing.load_public(public))
    except LlmgwError as exc:
        _fail(exc)
        return
    click.echo(
        f"wrote {path} and {public} ({fingerprint}); give sites {public.name} for `llmgw bundle trust add`"
    )


@bundle.group()
def trust() -> None:
    """The public keys whose signed bundles this machine imports."""


_trust_dir = click.option(
    "--trust-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=signing.DEFAULT_TRUST_DIR,
    show_default=True,
    help=_TRUST_DIR_HELP,
)


@trust.command(name="add")
@click.argument("keyfile", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--name", help="What to call the key [default: KEYFILE's name].")
@_trust_dir
def trust_add(keyfile: Path, name: str | None, trust_dir: Path) -> None:
    """Trust bundles signed by the key whose public half is in KEYFILE."""
    try:
        added = signing.trust(trust_dir, keyfile, name)
    except LlmgwError as exc:
        _fail(exc)
        return
    click.echo(f"trusted {added.name} ({added.fingerprint})")


@trust.command(name="list")
@_trust_dir
def trust_list(trust_dir: Path) -> None:
    """The trusted keys, with their fingerprints."""
    try:
        keys = signing.trusted_keys(trust_dir)
    except LlmgwError as exc:
        _fail(exc)
        return
    if not keys:
        click.echo(
            f"no key is trusted in {trust_dir}: any signed bundle is refused, and unsigned ones imported"
        )
    for key in keys:
        click.echo(f"{key.name}  {key.fingerprint}")


@trust.command(name="rm")
@click.argument("name")
@_trust_dir
def trust_rm(name: str, trust_dir: Path) -> None:
    """Stop trusting the key called NAME."""
    try:
        signing.distrust(trust_dir, name)
    except BundleError as exc:
        _fail(exc)
        return
    click.echo(f"no longer trusted: {name}")
