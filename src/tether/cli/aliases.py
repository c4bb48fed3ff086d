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
# Tracing switches of nats-server map onto our log level.
_TRACE = {"-D": "debug", "-V": "debug", "-DV": "debug", "-VV": "debug", "-DVV": "debug"}


def normalize(argv: list[str]) -> list[str]:
    """Rewrite nats-server style flags (``-sd=DIR``, ``-js``, ``-DV``…) to ours."""
    out: list[str] = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        if arg in _TRACE:
            out += ["--log-level", _TRACE[arg]]
        elif name in _ALIASES:
            out.append(_ALIASES[name] + (eq + value))
        else:
            out.append(arg)
    return out
