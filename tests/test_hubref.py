"""A model on a hub named as org/model@REVISION: read, or refused in words."""

from __future__ import annotations

import pytest

from llmgw.hubref import RefError, parse_ref

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class TestReferences:
    def test_a_reference_without_a_revision_means_main(self) -> None:
        assert parse_ref("org/model") == ("org/model", "main")
        assert parse_ref("org/model@" + COMMIT) == ("org/model", COMMIT)
        assert parse_ref("gpt2@refs/pr/1") == ("gpt2", "refs/pr/1")

    @pytest.mark.parametrize(
        ("ref", "says"),
        [
            ("org/model@", "names no revision"),
            ("../etc@main", "is not a repository name"),
            ("org/model/extra", "is not a repository name"),
            ("org/model@../../x", "is not a revision"),
            ("", "is not a repository name"),
        ],
    )
    def test_a_malformed_reference_is_refused_in_words(self, ref: str, says: str) -> None:
        with pytest.raises(RefError, match=says):
            parse_ref(ref)
