"""The connection security flags of every remote command (``--tlsca``, ``--tlscert``,
``--tlskey``, ``--tlsfirst``, ``--nkey``, ``--creds``) and contexts that keep them, against
``tether serve`` configured with TLS and with an nkey user."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import nkeys
import trustme

from tether.testing import run_server


def tether(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tether", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "XDG_CONFIG_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def one_line_failure(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def tls_files(tmp_path: Path, settings: str = "", tail: str = "") -> dict[str, Path]:
    """A CA, the server's certificate for localhost, a client certificate, and a
    configuration file (``conf``) with a ``tls`` block using them plus ``settings``."""
    ca = trustme.CA()
    server, client = ca.issue_cert("localhost"), ca.issue_cert("ops@example.com")
    files = {k: tmp_path / f"{k}.pem" for k in ("cert", "key", "ca", "ccert", "ckey")}
    server.cert_chain_pems[0].write_to_path(files["cert"])
    server.private_key_pem.write_to_path(files["key"])
    ca.cert_pem.write_to_path(files["ca"])
    client.cert_chain_pems[0].write_to_path(files["ccert"])
    client.private_key_pem.write_to_path(files["ckey"])
    files["conf"] = tmp_path / "tls.conf"
    files["conf"].write_text(
        f'tls {{\n  cert_file: "{files["cert"]}"\n  key_file: "{files["key"]}"\n'
        f"{settings}}}\n{tail}"
    )
    return files


def test_tls_flags_and_a_context_that_keeps_them(tmp_path: Path) -> None:
    files = tls_files(tmp_path, f'  ca_file: "{tmp_path / "ca.pem"}"\n  verify: true\n')
    conf = files["conf"]
    ca_flags = ["--tlsca", str(files["ca"])]
    cert_flags = ["--tlscert", str(files["ccert"]), "--tlskey", str(files["ckey"])]
    with run_server(store="memory", args=["-c", str(conf)]) as srv:
        url = f"nats://localhost:{srv.port}"
        done = tether(tmp_path, "server", "ping", "--count", "1", "-s", url, *ca_flags, *cert_flags)
        assert done.returncode == 0, done.stderr
        done = tether(tmp_path, "pub", "tls.check", "hi", "-s", f"tls://localhost:{srv.port}",
                      *ca_flags, *cert_flags)  # fmt: skip
        assert done.returncode == 0, done.stderr
        # The server's certificate is not trusted without the CA: one line, exit 1.
        one_line_failure(
            tether(tmp_path, "pub", "x", "y", "-s", url, *cert_flags), "cannot connect"
        )
        one_line_failure(
            tether(tmp_path, "pub", "x", "y", "-s", url, "--tlscert", str(files["ccert"])),
            "--tlscert and --tlskey go together",
        )
        one_line_failure(
            tether(tmp_path, "pub", "x", "y", "-s", url, "--tlsca", str(tmp_path / "none.pem")),
            "TLS files",
        )
        # A context keeps the TLS files; commands then need no flags.
        done = tether(tmp_path, "context", "add", "secure", "-s", url, *ca_flags, *cert_flags,
                      "--select")  # fmt: skip
        assert done.returncode == 0, done.stderr
        shown = tether(tmp_path, "context", "show", "secure").stdout
        assert str(files["ca"]) in shown and str(files["ckey"]) in shown
        done = tether(tmp_path, "pub", "tls.check", "from the context")
        assert done.returncode == 0, done.stderr


def test_tls_first(tmp_path: Path) -> None:
    conf = tls_files(tmp_path, "  handshake_first: true\n")["conf"]
    with run_server(store="memory", args=["-c", str(conf)]) as srv:
        url = f"tls://localhost:{srv.port}"
        flags = ["-s", url, "--tlsca", str(tmp_path / "ca.pem")]
        assert tether(tmp_path, "pub", "a", "b", *flags, "--tlsfirst").returncode == 0
        # Waiting for INFO that never comes in plain text: a timeout, one line.
        one_line_failure(
            tether(tmp_path, "pub", "a", "b", *flags, "--connect-timeout", "1"), "cannot connect"
        )


def test_nkey_and_creds_flags(tmp_path: Path) -> None:
    user = nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
    other = nkeys.from_seed(nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
    (tmp_path / "user.nk").write_bytes(user.seed)
    (tmp_path / "other.nk").write_bytes(other.seed)
    conf = tmp_path / "nkeys.conf"
    conf.write_text(f"authorization {{ users: [ {{nkey: {user.public_key.decode()}}} ] }}\n")
    with run_server(store="memory", args=["-c", str(conf)]) as srv:
        flags = ["-s", srv.url]
        done = tether(tmp_path, "pub", "n.x", "hi", *flags, "--nkey", str(tmp_path / "user.nk"))
        assert done.returncode == 0, done.stderr
        one_line_failure(
            tether(tmp_path, "pub", "n.x", "hi", *flags, "--nkey", str(tmp_path / "other.nk")),
            "Authorization Violation",
        )
        one_line_failure(tether(tmp_path, "pub", "n.x", "hi", *flags), "Authorization Violation")
        one_line_failure(
            tether(tmp_path, "stream", "ls", *flags, "--creds", str(tmp_path / "missing.creds")),
            "cannot read",
        )
        one_line_failure(
            tether(tmp_path, "stream", "ls", *flags, "--creds", str(conf)), "credentials"
        )


def test_jobs_over_https(tmp_path: Path) -> None:
    """The jobs commands verify an https:// API with --tlsca, or with a context's CA."""
    conf = tls_files(tmp_path, tail="https: -1\n")["conf"]
    with run_server(store="memory", args=["-c", str(conf)]) as srv:
        api = f"https://localhost:{srv.http_port}"
        ca_file = str(tmp_path / "ca.pem")
        done = tether(
            tmp_path, "jobs", "channel", "add", "orders", "--http", api, "--tlsca", ca_file
        )
        assert done.returncode == 0, done.stderr
        one_line_failure(
            tether(tmp_path, "jobs", "channel", "ls", "--http", api), "CERTIFICATE_VERIFY_FAILED"
        )
        done = tether(tmp_path, "context", "add", "web", "--http", api, "--tlsca", ca_file,
                      "--select")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert tether(tmp_path, "jobs", "channel", "ls", "--json").stdout.split() == [
            "[",
            '"orders"',
            "]",
        ]
