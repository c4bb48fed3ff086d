"""Node.js clients in the integration tests: npm installs the packages once into a temporary
directory beside the scripts, node runs a script whose last line on stdout is its result as
JSON. Without node or npm the tests are skipped, unless ``CI`` is set (then they fail: the
clients must be tested there)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest


def missing(why: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{why} (CI is set: the Node.js clients must be tested)")
    pytest.skip(why)


def npm_install(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    packages: Sequence[str],
    scripts: Mapping[str, str],
) -> Path:
    """A directory holding ``packages`` (installed with npm) and ``scripts`` (file name to
    source), ready for :func:`run_node`."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing(f"node and npm are needed to test {name}")
    where = tmp_path_factory.mktemp(name)
    (where / "package.json").write_text(json.dumps({"name": f"{name}-check", "private": True}))
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--silent", *packages],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        missing(f"npm install for {name} failed: {done.stderr.strip()[-500:]}")
    for file, source in scripts.items():
        (where / file).write_text(source)
    return where


def run_node(where: Path, script: str, *args: str, timeout: float = 60) -> Any:
    """Run ``node script args…`` in ``where``; the JSON of its last line of output."""
    done = subprocess.run(
        ["node", script, *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing: {done.stderr}"
    return json.loads(lines[-1])
