"""docs/architecture.md lists every module as ``scripts/rooms`` prints it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_module_list_is_current() -> None:
    printed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "rooms")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert printed in doc, "docs/architecture.md is out of date: run python3 scripts/rooms --write"
