"""A new user's mistakes on the command line: each is one clear line and a non-zero exit.

Also the flags every command line tool is expected to have (``-h``, ``--version``), the
help text itself, and ``scripts/serve``/``scripts/test`` installing only when needed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tether.version import __version__

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--store", "memory", "--port", "-1", "--http-port", "-1", "--nsq-port", "-1"]


def tether(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The single line of error output, after checking the exit code and the shape."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- storage -------------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["bogus", "sqlite:", "mysql://db"])
def test_unknown_store_names_the_accepted_forms(tmp_path: Path, store: str) -> None:
    line = one_line_error(tether("serve", "--store", store, "-p", "-1", "-m", "-1", cwd=tmp_path))
    assert line.startswith("tether: ")
    assert "--store" in line and store in line
    assert "memory" in line and "sqlite:DIR" in line


def test_unknown_store_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text('store = "bogus"\nport = -1\nhttp_port = -1\n')
    line = one_line_error(tether("serve", "--config", str(config), cwd=tmp_path))
    assert "tether.toml" in line and "store" in line and "sqlite:DIR" in line


# -- ports ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "name"),
    [
        (["--port", "99999"], "--port"),
        (["--port", "70000"], "--port"),
        (["--port=65536"], "--port"),
        (["-p", "-2"], "--port"),
        (["--http-port", "99999"], "--http-port"),
        (["-m", "70000"], "--http-port"),
        (["--http_port", "-5"], "--http-port"),
    ],
)
def test_port_out_of_range(tmp_path: Path, flags: list[str], name: str) -> None:
    args = ["--store", "memory", *flags]
    line = one_line_error(tether("serve", *args, cwd=tmp_path))
    assert line.startswith("tether: ")
    assert name in line and flags[-1].rpartition("=")[2] in line
    assert "65535" in line and "-1" in line


def test_port_out_of_range_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text('[server]\nport = 99999\nhttp_port = -1\nstore = "memory"\n')
    line = one_line_error(tether("serve", "-c", str(config), cwd=tmp_path))
    assert "tether.toml" in line and "port" in line and "99999" in line and "65535" in line


def test_port_out_of_range_in_the_ini_listener(tmp_path: Path) -> None:
    ini = tmp_path / "broker.cfg"
    ini.write_text("[http]\nlistener=:99999\n")
    args = ["--webhook-broker-config", str(ini), "--store", "memory", "-p", "-1"]
    line = one_line_error(tether("serve", *args, cwd=tmp_path))
    assert "broker.cfg" in line and "99999" in line and "65535" in line


def test_same_port_twice(tmp_path: Path) -> None:
    port = str(free_port())
    line = one_line_error(
        tether("serve", "--store", "memory", "-p", port, "-m", port, cwd=tmp_path)
    )
    assert "--port" in line and "--http-port" in line and port in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("flag", "other"), [("--port", "--http-port"), ("--http-port", "--port")], ids=["nats", "http"]
)
def test_port_in_use_names_the_address(
    tmp_path: Path, busy_port: int, flag: str, other: str
) -> None:
    args = ["--store", "memory", flag, str(busy_port), other, "-1"]
    line = one_line_error(tether("serve", *args, cwd=tmp_path), code=1)
    assert "cannot start" in line
    assert f"127.0.0.1:{busy_port}" in line and "in use" in line
    assert flag in line


QUICK_ZERO = ["--store", "memory", "--nsq-port", "0", "-p", "0", "-m", "0"]


def test_port_zero_picks_a_free_port(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "serve", *QUICK_ZERO],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:
            seen.append(line)
            if "Server is ready" in line:
                break
        text = "".join(seen)
        m = re.search(r"Listening for client connections on 127\.0\.0\.1:(\d+)", text)
        assert m and int(m.group(1)) > 0, text
        m = re.search(r"Starting http monitor on 127\.0\.0\.1:(\d+)", text)
        assert m and int(m.group(1)) > 0, text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert proc.stderr is not None
        proc.stderr.close()


# -- log level -----------------------------------------------------------------------------


def test_unknown_log_level_lists_the_valid_ones(tmp_path: Path) -> None:
    line = one_line_error(tether("serve", *QUICK, "--log-level", "verbose", cwd=tmp_path))
    assert line.startswith("tether: ")
    assert "--log-level" in line and "verbose" in line
    for level in ("debug", "info", "warning", "error"):
        assert level in line


def test_unknown_log_level_in_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "tether.toml"
    config.write_text('log_level = "loud"\nstore = "memory"\n')
    line = one_line_error(tether("serve", "--config", str(config), cwd=tmp_path))
    assert "tether.toml" in line and "loud" in line and "warning" in line


# -- other usage errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve", "--port", "abc"], "--port"),
        (["serve", "--no-such-flag"], "--no-such-flag"),
        (["serve", "--host"], "--host"),
        (["no-such-command"], "no-such-command"),
    ],
    ids=["not a number", "unknown flag", "missing value", "unknown command"],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    line = one_line_error(tether(*args, cwd=tmp_path))
    assert line.startswith("tether: ") and expected in line
    assert "-h" in line  # where to look next


@pytest.mark.parametrize("kind", ["toml", "ini"])
def test_missing_config_files_read_alike(tmp_path: Path, kind: str) -> None:
    flag = {"toml": "--config", "ini": "--webhook-broker-config"}[kind]
    missing = tmp_path / f"nope.{kind}"
    line = one_line_error(tether("serve", *QUICK, flag, str(missing), cwd=tmp_path))
    assert line == f"tether: {missing}: cannot read: No such file or directory"


@pytest.mark.parametrize(
    "content",
    ["max-retry = 3\n", "[broker]\nmax-retry = many\n", "[broker]\nmax-retry\n"],
    ids=["no section", "not a number", "no value"],
)
def test_bad_ini_file_is_one_line(tmp_path: Path, content: str) -> None:
    ini = tmp_path / "broker.cfg"
    ini.write_text(content)
    line = one_line_error(
        tether("serve", *QUICK, "--webhook-broker-config", str(ini), cwd=tmp_path)
    )
    assert line.startswith(f"tether: {ini}: ")


# -- version and help ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["--version"], ["-v"], ["serve", "--version"], ["serve", "-v"], ["version"]],
)
def test_version_flags(tmp_path: Path, args: list[str]) -> None:
    proc = tether(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{__version__}\n"


@pytest.mark.parametrize("args", [["-h"], ["--help"], ["serve", "-h"], ["version", "-h"], []])
def test_help_flags(tmp_path: Path, args: list[str]) -> None:
    proc = tether(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout
    assert "-h" in proc.stdout and "--help" in proc.stdout


def serve_help(tmp_path: Path) -> str:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    proc = tether("serve", "--help", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_help_keeps_bracketed_section_names(tmp_path: Path) -> None:
    text = serve_help(tmp_path)
    assert "[broker]" in text and "[consumer-connection]" in text
    assert ", , " not in text


def test_help_shows_no_value_for_switches(tmp_path: Path) -> None:
    text = serve_help(tmp_path)
    for switch in ("--jetstream", "--version"):
        line = next(line for line in text.splitlines() if switch in line)
        assert "<bool>" not in line and "BOOLEAN" not in line, line


def test_help_gives_the_port_range(tmp_path: Path) -> None:
    text = serve_help(tmp_path)
    line = next(line for line in text.splitlines() if "--http-port" in line)
    assert "65535" in line and "-1" in line


# -- scripts/serve and scripts/test install once -------------------------------------------


def fake(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A copy of the scripts and pyproject.toml over a .venv whose programs only log."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    for name in ("serve", "test"):
        shutil.copy2(ROOT / "scripts" / name, root / "scripts" / name)
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = 'echo "$(basename "$0") $*" >>"$(dirname "$0")/../../calls"'
    fake(bin_dir / "python", log)
    for tool in ("tether", "ruff", "mypy"):
        fake(bin_dir / tool, log)
    fake(root / "scripts" / "system-packages", "exit 0")  # no Debian packages here
    return root


def calls(root: Path) -> list[str]:
    path = root / "calls"
    found = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return found


def run_script(root: Path, name: str, *args: str) -> None:
    subprocess.run([str(root / "scripts" / name), *args], check=True, timeout=30)


def installs(found: list[str]) -> list[str]:
    return [c.rpartition(" ")[2] for c in found if "pip install -q -e" in c]


def test_scripts_install_only_when_needed(clone: Path) -> None:
    run_script(clone, "serve", "--port", "-1")
    first = calls(clone)
    assert installs(first) == ["."]
    assert first[-1] == "tether serve --port -1"

    run_script(clone, "serve", "-p", "-1")
    assert calls(clone) == ["tether serve -p -1"]  # no pip at all

    run_script(clone, "test", "-q")
    assert installs(calls(clone)) == [".[test]"]
    run_script(clone, "test", "-q")
    assert installs(calls(clone)) == []
    run_script(clone, "serve")
    assert calls(clone) == ["tether serve"]  # the test extras include what serve needs

    with (clone / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    run_script(clone, "serve")
    assert installs(calls(clone)) == [".[test]"]  # the extras installed stay installed
    run_script(clone, "test")
    assert installs(calls(clone)) == []


def test_scripts_reinstall_a_broken_venv(clone: Path) -> None:
    run_script(clone, "serve")
    calls(clone)
    (clone / ".venv" / "bin" / "tether").unlink()
    subprocess.run([str(clone / "scripts" / "serve")], timeout=30, capture_output=True)
    assert installs(calls(clone)) == ["."]
