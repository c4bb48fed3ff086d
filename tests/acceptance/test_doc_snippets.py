"""The code blocks of README.md and docs/*.md run as written.

Every fenced ``python`` block is one test case, named after its file and the line of its
opening fence (``docs/client.md:21``). A runnable block is written to a file and run
with this interpreter in a subprocess (in an empty working directory, with a timeout),
as a reader who followed the README would run it. It must exit with status 0.

**Servers and ports.** Blocks hard-code the documented addresses, as a reader would
type them: ``nats://127.0.0.1:4222`` and ``http://127.0.0.1:8222`` (``localhost``
works too). Each runnable block gets a fresh server (in-memory store) on free ports,
and those two addresses are rewritten to that server's ports in the block's text
before it runs. So a server already running on the default ports is never touched, and
blocks that create the same streams do not collide.

**Imports.** ``./scripts/serve`` installs Tether and its dependencies, nothing else. A
block may import the standard library, ``tether`` and the distributions Tether depends
on; anything else only if its marker names it with ``requires=`` (and the file tells
the reader to ``pip install`` it before the block).

**Markers.** An HTML comment on the line before the opening fence (blank lines between
are allowed) tells the test about a block; words combine::

    <!-- snippet: partial -->           a fragment (it continues an earlier block or
                                        leaves parts out): only compiled (top-level
                                        await allowed) and its imports executed
    <!-- snippet: requires=nats-py -->  needs these distributions (comma-separated)
                                        beyond what ./scripts/serve installs
    <!-- snippet: needs-spark -->       needs PySpark and Java; if the block does not
                                        define ``spark``, it runs after a line creating a
                                        local SparkSession named ``spark`` (as in the
                                        ``pyspark`` shell)
    <!-- snippet: curl-walkthrough -->  a ``sh`` block run with bash against a live
                                        server (below)

Blocks of docs/spark.md are ``needs-spark`` even without a marker. Without PySpark or
Java such blocks are skipped, and so are curl walkthroughs without bash or curl, except
when the ``CI`` environment variable is set: then they fail.

**curl walkthroughs** run with ``bash`` under ``set -euo pipefail`` with ``curl``
wrapped to add ``--fail-with-body`` (any HTTP status from 400 up stops the script).
Their output is checked for the steps the walkthrough promises: the status codes its
``-w ' %{http_code}'`` prints, a claimed job with its deadline, a dead letter, and the
states jobs end in.

Other blocks (``sh``, ``toml``, wire transcripts) are not run, except that every
``toml`` block must load with the server's configuration loader.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tether.server.config import load_config
from tether.testing import RunningServer, run_server

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SPARK_DOC = "docs/spark.md"

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*snippet:(.*?)-->\s*$")
_KNOWN = {"partial", "needs-spark", "curl-walkthrough"}
_NATS_DEFAULT = re.compile(r"\b(?:127\.0\.0\.1|localhost):4222\b")
_HTTP_DEFAULT = re.compile(r"\b(?:127\.0\.0\.1|localhost):8222\b")
_STATUS = re.compile(r"^(.*?) ?\b([1-5]\d\d)$")

PYTHON_TIMEOUT = 60.0
SPARK_TIMEOUT = 180.0
SHELL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Block:
    doc: str  # path relative to the repository root
    line: int  # line of the opening fence, 1-based
    lang: str
    code: str
    words: frozenset[str]  # the marker's words
    before: str  # the file's text above the block

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def partial(self) -> bool:
        return "partial" in self.words

    @property
    def needs_spark(self) -> bool:
        return "needs-spark" in self.words or (self.doc == SPARK_DOC and self.lang == "python")

    @property
    def requires(self) -> list[str]:
        out = []
        for word in self.words:
            if word.startswith("requires="):
                out += [name for name in word.removeprefix("requires=").split(",") if name]
        return out

    @property
    def unknown_words(self) -> list[str]:
        return sorted(w for w in self.words if w not in _KNOWN and not w.startswith("requires="))


@dataclass(frozen=True)
class StrayMarker:
    doc: str
    line: int
    text: str


def parse(path: Path) -> tuple[list[Block], list[StrayMarker]]:
    """The fenced blocks of one Markdown file, and markers attached to no block."""
    doc = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    strays: list[StrayMarker] = []
    marker: tuple[int, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := _MARKER.match(line):
            if marker is not None:
                strays.append(StrayMarker(doc, marker[0] + 1, marker[1]))
            marker = (i, m.group(1))
            i += 1
            continue
        if m := _FENCE.match(line):
            fence, lang = m.group(1), m.group(2).lower()
            end = i + 1
            while end < len(lines) and not lines[end].startswith(fence):
                end += 1
            words = frozenset(marker[1].split()) if marker is not None else frozenset()
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(doc, i + 1, lang, code, words, "\n".join(lines[:i])))
            marker = None
            i = end + 1
            continue
        if line.strip() and marker is not None:
            strays.append(StrayMarker(doc, marker[0] + 1, marker[1]))
            marker = None
        i += 1
    if marker is not None:
        strays.append(StrayMarker(doc, marker[0] + 1, marker[1]))
    return blocks, strays


def all_blocks() -> tuple[list[Block], list[StrayMarker]]:
    blocks: list[Block] = []
    strays: list[StrayMarker] = []
    for path in DOCS:
        found, stray = parse(path)
        blocks += found
        strays += stray
    return blocks, strays


BLOCKS, STRAYS = all_blocks()
PYTHON = [b for b in BLOCKS if b.lang in ("python", "py")]
WALKTHROUGHS = [b for b in BLOCKS if "curl-walkthrough" in b.words]
TOML = [b for b in BLOCKS if b.lang == "toml"]


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def unavailable(reason: str) -> None:
    """Skip for want of a tool, except in CI, which has them all."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: CI must be able to run every snippet)")
    pytest.skip(reason)


# -- what ./scripts/serve installs ------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def _distributions_of(name: str, extras: frozenset[str]) -> frozenset[str]:
    """``name`` and every distribution it needs (with ``extras``), transitively."""
    seen = {_canonical(name)}
    todo = [(name, extras)]
    while todo:
        dist, wanted = todo.pop()
        try:
            requirements = metadata.requires(dist) or []
        except metadata.PackageNotFoundError:
            continue
        envs = [{"extra": extra} for extra in wanted | {""}]
        for text in requirements:
            req = Requirement(text)
            needed = req.marker is None or any(req.marker.evaluate(env) for env in envs)
            if needed and _canonical(req.name) not in seen:
                seen.add(_canonical(req.name))
                todo.append((req.name, frozenset(req.extras)))
    return frozenset(seen)


@cache
def _module_owners() -> dict[str, frozenset[str]]:
    return {
        module: frozenset(_canonical(d) for d in dists)
        for module, dists in metadata.packages_distributions().items()
    }


def import_problems(block: Block, tree: ast.Module) -> list[str]:
    """Imports a reader who only ran ./scripts/serve could not satisfy."""
    allowed = set(_distributions_of("tether", frozenset()))
    if block.needs_spark:
        allowed |= _distributions_of("tether", frozenset({"spark"}))
    for name in block.requires:
        allowed |= _distributions_of(name, frozenset())
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        for module in modules:
            top = module.partition(".")[0]
            if top in sys.stdlib_module_names or top in ("tether", "pyspark_tether"):
                continue
            owners = _module_owners().get(top, frozenset())
            if not owners & allowed:
                problems.append(
                    f"imports {top!r} ({', '.join(sorted(owners)) or 'not installed'}), which "
                    "./scripts/serve does not install: add requires=<distribution> to the "
                    "block's marker and tell the reader to pip install it"
                )
    return problems


# -- running blocks ---------------------------------------------------------------------


def for_server(code: str, server: RunningServer) -> str:
    code = _NATS_DEFAULT.sub(f"{server.host}:{server.port}", code)
    return _HTTP_DEFAULT.sub(f"{server.host}:{server.http_port}", code)


def defines_spark(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "spark" and isinstance(node.ctx, ast.Store):
            return True
        if isinstance(node, ast.alias) and (node.asname or node.name) == "spark":
            return True
    return False


SPARK_SESSION = (
    "from pyspark.sql import SparkSession\n"
    "spark = (SparkSession.builder.master('local[2]')"
    ".config('spark.ui.enabled', 'false')"
    ".config('spark.driver.host', '127.0.0.1')"
    ".config('spark.driver.bindAddress', '127.0.0.1').getOrCreate())\n"
)


def require_spark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        unavailable("needs pyspark (the spark extra)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        unavailable("needs Java for a local Spark session")


def snippet_env() -> dict[str, str]:
    env = dict(os.environ)
    # Run as a reader would: Spark must find its Python on its own, as the docs promise.
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        env.pop(name, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def report(result: subprocess.CompletedProcess[str], code: str) -> str:
    return f"--- ran ---\n{code}\n--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"


def test_every_marker_belongs_to_a_block() -> None:
    assert not STRAYS, [f"{s.doc}:{s.line}: <!-- snippet:{s.text}-->" for s in STRAYS]


def test_the_docs_have_snippets() -> None:
    # A parser that found nothing would make every other test here vacuous.
    assert any(b.doc == "README.md" for b in PYTHON)
    assert len(WALKTHROUGHS) >= 1


@pytest.mark.parametrize("block", TOML, ids=[b.id for b in TOML])
def test_toml_block_loads(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "tether.toml"
    path.write_text(block.code)
    tomllib.loads(block.code)
    load_config(path, {})


def _python_params() -> list[object]:
    params: list[object] = []
    for b in PYTHON:
        marks = []
        if b.needs_spark:
            # A JVM starts in the snippet's process: more than the suite's default timeout.
            marks = [pytest.mark.spark, pytest.mark.timeout(SPARK_TIMEOUT + 30)]
        params.append(pytest.param(b, id=b.id, marks=marks))
    return params


@pytest.mark.parametrize("block", _python_params())
def test_python_block(block: Block, tmp_path: Path) -> None:
    assert not block.unknown_words, f"unknown marker words: {block.unknown_words}"
    tree = ast.parse(block.code, block.id)
    if block.partial:
        # A fragment must still compile; it may await at the top level, as it continues
        # an earlier block's coroutine.
        compile(tree, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert not (problems := import_problems(block, tree)), problems
    for name in block.requires:
        assert re.search(rf"pip install [^\n]*\b{re.escape(name)}\b", block.before), (
            f"{block.id} requires {name}, but {block.doc} does not say to "
            f"`pip install {name}` before it"
        )

    if block.needs_spark:
        require_spark()
    if block.partial:
        imports = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        code = ast.unparse(ast.Module(body=imports, type_ignores=[]))
        timeout = SPARK_TIMEOUT if block.needs_spark else PYTHON_TIMEOUT
        script = tmp_path / "imports.py"
        script.write_text(code + "\n")
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=snippet_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, report(result, code)
        return

    with run_server(store="memory") as server:
        code = for_server(block.code, server)
        if block.needs_spark and not defines_spark(tree):
            code = SPARK_SESSION + code
        script = tmp_path / "snippet.py"
        script.write_text(code)
        work = tmp_path / "cwd"
        work.mkdir()
        result = subprocess.run(
            [sys.executable, str(script)],
            cwd=work,
            env=snippet_env(),
            capture_output=True,
            text=True,
            timeout=SPARK_TIMEOUT if block.needs_spark else PYTHON_TIMEOUT,
            check=False,
        )
    assert result.returncode == 0, report(result, code)


# -- curl walkthroughs ------------------------------------------------------------------

CURL_STRICT = """set -euo pipefail
curl() { command curl --fail-with-body "$@"; }
"""


def transcript(stdout: str) -> tuple[list[int], list[object]]:
    """The status codes printed after bodies (``-w ' %{http_code}'``) and the JSON
    documents printed, in order."""
    codes: list[int] = []
    documents: list[object] = []
    for line in stdout.splitlines():
        body = line.strip()
        if m := _STATUS.match(body):
            body, code = m.group(1), int(m.group(2))
            if body and not body.endswith(("}", "]")):
                body, code = line.strip(), 0  # a number ending some other text
            if code:
                codes.append(code)
        if body:
            with contextlib.suppress(ValueError):
                documents.append(json.loads(body))
    return codes, documents


@pytest.mark.parametrize("block", WALKTHROUGHS, ids=[b.id for b in WALKTHROUGHS])
def test_curl_walkthrough(block: Block, tmp_path: Path) -> None:
    assert not block.unknown_words, f"unknown marker words: {block.unknown_words}"
    assert block.lang in ("sh", "bash", "shell"), "a curl walkthrough is a sh block"
    for tool in ("bash", "curl"):
        if shutil.which(tool) is None:
            unavailable(f"needs {tool} to run the curl walkthrough")
    with run_server(store="memory") as server:
        code = CURL_STRICT + for_server(block.code, server)
        result = subprocess.run(
            ["bash", "-c", code],
            cwd=tmp_path,
            env=snippet_env(),
            capture_output=True,
            text=True,
            timeout=SHELL_TIMEOUT,
            check=False,
        )
    assert result.returncode == 0, report(result, code)
    codes, documents = transcript(result.stdout)
    objects = [d for d in documents if isinstance(d, dict)]
    # Resources were created (200), messages broadcast (201), jobs moved (202).
    assert {200, 201, 202} <= set(codes), (codes, result.stdout)
    # A claim: jobs handed out with their deadline.
    claimed = [
        job
        for d in objects
        if isinstance(d.get("Result"), list)
        for job in d["Result"]
        if isinstance(job, dict) and "Deadline" in job
    ]
    assert claimed, result.stdout
    # A dead letter was listed.
    dead = [j for d in objects for j in d.get("DeadJobs") or [] if j.get("Status") == "DEAD"]
    assert dead, result.stdout
    # Jobs read at the end: one delivered, one queued again after the requeue.
    states = [d["Status"] for d in objects if "Status" in d and "ConsumerURL" in d]
    assert "DELIVERED" in states and "QUEUED" in states, result.stdout
