"""nats-server's flag spellings, so tools that launch nats-server can launch Tether."""

from __future__ import annotations

# alias -> canonical long flag (taking a value unless listed in _SWITCHES)
_ALIASES = {
    "-p": "--port",
    "-a": "--host",
    "--addr": "--host",
    "--net": "--host",
    "-m": "--http-port",
    "--http_port": "--http-port",
    "-sd": "--store-dir",
    "--store_dir": "--store-dir",
    "-js": "--jetstream",
    "-sl": "--signal",
    "--js": "--jetstream",
    "--pass": "--password",
    "--auth": "--auth-token",
    "--max_payload": "--max-payload",
    "--max_connections": "--max-connections",
    "--max_pending": "--max-pending",
    "-c": "--config",
    "-n": "--server-name",
    "--name": "--server-name",
    "--server_name": "--server-name",
}
# Switches that Go's flag package also takes as -name=<bool>.
_BOOL_SWITCHES = {"--jetstream", "--tls", "--tlsverify"}
# Go's strconv.ParseBool.
_GO_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_GO_FALSE = {"0", "f", "F", "false", "FALSE", "False"}
# Tracing switches of nats-server map onto our log level.
_TRACE = {"-D": "debug", "-V": "debug", "-DV": "debug", "-VV": "debug", "-DVV": "debug"}


def normalize(argv: list[str]) -> list[str]:
    """Rewrite nats-server style flags (``-sd=DIR``, ``-js``, ``-DV``…) to ours."""
    out: list[str] = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if arg in _TRACE:
            out += ["--log-level", _TRACE[arg]]
        elif _ALIASES.get(name, name) in _BOOL_SWITCHES and eq:
            out.append(_switch(_ALIASES.get(name, name), value))
        elif name in _ALIASES:
            out.append(_ALIASES[name] + (eq + value))
        else:
            out.append(arg)
    return out


def _switch(flag: str, value: str) -> str:
    """``--jetstream=false`` → ``--no-jetstream``, as Go reads ``-js=false``."""
    if value in _GO_TRUE:
        return flag
    if value in _GO_FALSE:
        return "--no-" + flag[2:]
    return f"{flag}={value}"  # click says what is wrong with it
