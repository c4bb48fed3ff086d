"""The dashboard's JSON and who may see and do what, without a browser: ``ui_anonymous =
"refuse"``, authentication configured without an admin password, ``ui = false``,
JetStream off, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import nats
from dashboard_support import dead_letter

from tether.testing import run_server


def _config(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "tether.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_refuse_mode_needs_the_credentials(tmp_path: Path) -> None:
    conf = _config(tmp_path, 'http_admin_password = "pw"', 'ui_anonymous = "refuse"')
    with run_server(store="memory", args=["--config", conf]) as srv, httpx.Client() as http:
        for path in ("/ui/", "/ui/api/overview", "/ui/api/session"):
            r = http.get(srv.http_url + path)
            assert r.status_code == 401, path
            assert r.headers["www-authenticate"].startswith("Basic")
        assert http.get(srv.http_url + "/ui/", auth=("admin", "pw")).status_code == 200
        assert http.get(srv.http_url + "/ui/", auth=("admin", "nope")).status_code == 401
        session = http.get(srv.http_url + "/ui/api/session", auth=("admin", "pw")).json()
        assert session["may_act"] and session["logged_in"] and session["contents"]
        # /metrics and the monitoring endpoints stay as they are.
        assert http.get(srv.http_url + "/metrics").status_code == 200


def test_refuse_without_a_password_does_not_start(tmp_path: Path) -> None:
    conf = _config(tmp_path, 'ui_anonymous = "refuse"')
    done = subprocess.run(
        [sys.executable, "-m", "tether", "serve", "--config", conf, "--store", "memory"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "http_admin_password" in done.stderr


async def test_client_auth_without_admin_password_keeps_the_dashboard_read_only(
    tmp_path: Path,
) -> None:
    conf = _config(tmp_path, 'auth_token = "s3cret"')
    with run_server(store="memory", args=["--config", conf]) as srv:
        nc = await nats.connect(srv.url, token="s3cret")
        try:
            await dead_letter(nc.jetstream(), "SECRET", "secret.a", payload=b"do not show")
        finally:
            await nc.close()
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            session = (await http.get("/ui/api/session")).json()
            assert not session["may_act"] and "http_admin_password" in session["refusal"]
            assert not session["contents"]
            page = await http.get("/ui/api/streams/SECRET/messages")
            assert page.status_code == 401 and "do not show" not in page.text
            consumer = (await http.get("/ui/api/streams/SECRET/consumers/c")).json()
            assert consumer["dead"] == 1  # counts are shown
            r = await http.post(
                "/ui/api/streams/SECRET/consumers/c/dead/requeue",
                json={},
                headers={"x-tether-csrf": session["csrf"]},
            )
            assert r.status_code == 403


def test_ui_off(tmp_path: Path) -> None:
    conf = _config(tmp_path, "ui = false")
    with run_server(store="memory", args=["--config", conf]) as srv, httpx.Client() as http:
        assert http.get(srv.http_url + "/ui/").status_code == 404
        assert http.get(srv.http_url + "/docs").status_code == 404
        assert http.get(srv.http_url + "/metrics").status_code == 200


def test_jetstream_off() -> None:
    with run_server(store="memory", args=["--no-jetstream"]) as srv, httpx.Client() as http:
        overview = http.get(srv.http_url + "/ui/api/overview")
        assert overview.status_code == 200 and overview.json()["jetstream"] is False
        assert http.get(srv.http_url + "/ui/api/streams").status_code == 503
        assert "tether_server_connections" in http.get(srv.http_url + "/metrics").text


async def test_bad_input_is_a_4xx() -> None:
    with run_server(store="memory") as srv:
        nc = await nats.connect(srv.url)
        try:
            await nc.jetstream().add_stream(name="S", subjects=["s.>"])
        finally:
            await nc.close()
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            csrf = {"x-tether-csrf": (await http.get("/ui/api/session")).json()["csrf"]}
            cases = [
                await http.get("/ui/api/streams/S/messages?subject=a..b"),
                await http.get("/ui/api/streams/S/messages?start=x"),
                await http.get("/ui/api/streams/NOPE"),
                await http.get("/ui/api/streams/S/consumers/none"),
                await http.post("/ui/api/streams/S/consumers/none/dead/zap", headers=csrf),
                await http.post(
                    "/ui/api/streams/S/consumers/none/dead/requeue", json={}, headers=csrf
                ),
                await http.post(
                    "/ui/api/jobs/ch/k/dead/requeue", content=b"{not json", headers=csrf
                ),
                await http.get("/ui/static/../dashboard.py"),
                await http.get("/docs/static/index.html"),
            ]
            assert [r.status_code for r in cases] == [400, 400, 404, 404, 404, 404, 404, 404, 404]
            assert all(r.status_code < 500 for r in cases)


async def test_message_pages() -> None:
    with run_server(store="memory") as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await js.add_stream(name="P", subjects=["p.>"])
            for i in range(300):
                await js.publish("p.rare" if i % 100 == 7 else "p.common", b"%d" % i)
        finally:
            await nc.close()
        async with httpx.AsyncClient(base_url=srv.http_url) as http:

            async def seqs(query: str) -> list[int]:
                page = (await http.get("/ui/api/streams/P/messages?" + query)).json()
                return [m["seq"] for m in page["messages"]]

            assert await seqs("limit=5") == [296, 297, 298, 299, 300]
            assert await seqs("subject=p.rare") == [8, 108, 208]
            assert await seqs("subject=p.*&limit=2") == [299, 300]
            assert await seqs("start=10&limit=3") == [10, 11, 12]
            assert await seqs("start=1&subject=p.rare&limit=2") == [8, 108]
