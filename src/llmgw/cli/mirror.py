"""`llmgw mirror`: models fetched into the mirror's directory, from a shell on the mirror's machine."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from llmgw import config
from llmgw.cli.exit import EXIT_CONFIG, EXIT_ERROR
from llmgw.config import MirrorConfig
from llmgw.download import human_bytes
from llmgw.errors import ConfigError, LlmgwError
from llmgw.hubref import parse_ref
from llmgw.mirror.fetch import FetchedModel, FetchProgress, HubFetcher, read_token

DEFAULT_CONFIG = Path("/etc/llmgw/mirror.yaml")


@click.group()
def mirror() -> None:
    """The model mirror: fetch models from a Hugging Face–compatible hub into its directory."""


@mirror.command()
@click.argument("ref", metavar="REPO[@REVISION]")
@click.option(
    "--include",
    multiple=True,
    metavar="GLOB",
    help="Fetch only the files whose path matches GLOB (such as '*.gguf'); repeat it for several. "
    "Without it, every file of the revision.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=DEFAULT_CONFIG,
    show_default=True,
    help="The mirror's configuration (root, hf_endpoint, hf_token_file); "
    "the defaults when this default file does not exist.",
)
@click.option("--root", type=click.Path(path_type=Path, file_okay=False), help="Override the mirror's root.")
@click.option("--endpoint", metavar="URL", help="Override hf_endpoint: the hub to fetch from.")
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Override hf_token_file: the file holding the hub's access token.",
)
def fetch(
    ref: str,
    include: tuple[str, ...],
    config_path: Path,
    root: Path | None,
    endpoint: str | None,
    token_file: Path | None,
) -> None:
    """Download REPO at REVISION (default main) into ROOT/REPO/COMMIT/, every file checked against the hub."""
    try:
        cfg = _load(config_path)
        repo, revision = parse_ref(ref)
        token = read_token(str(token_file) if token_file is not None else cfg.hf_token_file)
        model = asyncio.run(
            _fetch(
                root if root is not None else Path(cfg.root),
                endpoint or cfg.hf_endpoint,
                token,
                repo,
                revision,
                include,
            )
        )
    except ConfigError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_CONFIG)
    except LlmgwError as exc:
        click.echo(f"llmgw: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(
        f"fetched {model.repo}@{model.revision} (commit {model.commit}): {len(model.files)} files, "
        f"{human_bytes(model.size, None)}; nodes fetch it from the mirror's "
        f"/files/{model.repo}/{model.commit}/"
    )


def _load(config_path: Path) -> MirrorConfig:
    if config_path == DEFAULT_CONFIG and not config_path.exists():
        return MirrorConfig()
    return config.load(MirrorConfig, config_path)


async def _fetch(
    root: Path, endpoint: str, token: str | None, repo: str, revision: str, include: tuple[str, ...]
) -> FetchedModel:
    def progress(p: FetchProgress) -> None:
        click.echo(p.describe(), err=True)

    async with HubFetcher(root, endpoint, token) as fetcher:
        return await fetcher.fetch(repo, revision, include, progress)
