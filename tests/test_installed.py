"""Where the running llmgw was installed from, read from what pip recorded (PEP 610)."""

from __future__ import annotations

from pathlib import Path

from llmgw import installed
from llmgw.installed import Origin, parse_direct_url

REPO = Path(__file__).resolve().parents[1]


def test_an_editable_install_of_a_checkout_is_from_that_checkout() -> None:
    said = '{"dir_info": {"editable": true}, "url": "file:///home/you/llmgw"}'
    assert parse_direct_url(said) == Origin(checkout=Path("/home/you/llmgw"))


def test_an_install_from_a_wheel_file_names_the_file() -> None:
    said = '{"archive_info": {}, "url": "file:///home/you/llmgw/dist/llmgw-0.1.0-py3-none-any.whl"}'
    assert parse_direct_url(said) == Origin(wheel=Path("/home/you/llmgw/dist/llmgw-0.1.0-py3-none-any.whl"))


def test_an_install_from_a_url_or_an_unreadable_record_counts_as_from_an_index() -> None:
    assert parse_direct_url('{"archive_info": {}, "url": "https://example.com/llmgw.whl"}').from_index
    assert parse_direct_url("not json").from_index


def test_this_test_environment_runs_llmgw_from_this_checkout() -> None:
    """`pip install -e .` of the checkout, as the tests are run."""
    assert installed.origin() == Origin(checkout=REPO)
