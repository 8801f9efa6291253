"""Tables on stdout: a header and aligned columns, as `llmgw ctl` and the tenancy commands print them."""

from __future__ import annotations

from collections.abc import Sequence

import click


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    for row in [list(headers), *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
