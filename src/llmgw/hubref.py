"""A model on a Hugging Face–compatible hub, named `org/model@REVISION`, and a catalog source naming one on
the mirror (`mirror:org/model@REVISION`).

Apart from mirror/fetch.py, which downloads what these name, because the catalog checks a model's
`mirror:` source when server.yaml is loaded, and the gateway (which builds on the catalog) must not
load the mirror's downloader to do so.
"""

from __future__ import annotations

import re

from llmgw.errors import LlmgwError

DEFAULT_REVISION = "main"
# A catalog model's `source` naming a model on the mirror: `mirror:REPO[@REVISION]`.
SOURCE_PREFIX = "mirror:"
COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
_REVISION = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._/-]*")


class RefError(LlmgwError):
    """A reference that names no model on a hub; the message says what is wrong with it."""


def parse_ref(ref: str) -> tuple[str, str]:
    """ "org/model@rev" -> (repo, revision); the revision is "main" when none is named."""
    repo, at, revision = ref.partition("@")
    if at and not revision:
        raise RefError(f"{ref!r} names no revision after '@' (write org/model or org/model@REVISION)")
    revision = revision or DEFAULT_REVISION
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise RefError(f"{repo!r} is not a repository name (expected org/model, such as Qwen/Qwen2.5-0.5B)")
    if not _REVISION.fullmatch(revision) or ".." in revision.split("/"):
        raise RefError(f"{revision!r} is not a revision (a branch, a tag or a commit hash)")
    return repo, revision
