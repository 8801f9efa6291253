"""Write docs/reference.md from the configuration's declarations: `make docs`."""

from __future__ import annotations

from pathlib import Path

from llmgw.config.reference import render

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"

if __name__ == "__main__":
    REFERENCE.write_text(render(), encoding="utf-8")
