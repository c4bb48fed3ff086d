"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright):
the overview updates, a stream page lists what was just published, a consumer's lag drops
once messages are acked, a dead letter requeued from the page is delivered again, and
read-only mode refuses actions. The tests save screenshots of the main pages to
docs/images/ (the README and docs/operations.md show them).

Without Chromium or Playwright the tests are skipped, unless ``CI`` is set (then they
fail: scripts/system-packages installs Chromium)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from dashboard_support import dead_letter
from nats.js import api

from tether.testing import RunningServer, run_server

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
CHROMIUM = os.environ.get("TETHER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _need_browser() -> None:
    why = None
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        why = "Playwright for Python is not installed (pip install -e '.[test]')"
    if why is None and not Path(CHROMIUM).is_file():
        why = f"no Chromium at {CHROMIUM} (scripts/system-packages installs Debian's chromium)"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI is set: the dashboard must be tested in a browser)")
        pytest.skip(why)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    _need_browser()
    with run_server() as srv:
        yield srv


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    _need_browser()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        chromium = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


async def _page(browser: Any, url: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    await page.goto(url)
    return page


async def _shot(page: Any, name: str) -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(IMAGES / f"{name}.png"), full_page=True)


async def _text(page: Any, selector: str) -> str:
    return str(await page.locator(selector).first.inner_text())


async def _eventually(check: Any, within: float = 8.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        try:
            result = await check()
        except AssertionError:
            if loop.time() > deadline:
                raise
        else:
            if result is not False:
                return result
            if loop.time() > deadline:
                raise AssertionError("condition not met in time")
        await asyncio.sleep(0.2)


async def test_overview_loads_and_updates(server: RunningServer, browser: Any) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="OVERVIEW", subjects=["overview.>"])
        page = await _page(browser, server.http_url + "/")
        assert page.url.endswith("/ui/")
        await page.wait_for_selector('[data-card="Streams"]')
        stamp = await page.locator("#main").get_attribute("data-updated")
        before = await _text(page, '[data-card="Messages"] .value')
        for i in range(30):
            await js.publish("overview.a", b"x%d" % i)

        async def grew() -> bool:
            now = await _text(page, '[data-card="Messages"] .value')
            return int(now.replace(",", "")) >= int(before.replace(",", "")) + 30

        await _eventually(grew)
        assert await page.locator("#main").get_attribute("data-updated") != stamp
        assert "sqlite:///" in await _text(page, '[data-card="Store"] .value')
        # A few seconds of traffic, so that the sparklines in the screenshot have a shape.
        sub = await js.pull_subscribe("overview.a", durable="reports", stream="OVERVIEW")
        for burst in range(8):
            for i in range(20 + 15 * burst):
                await js.publish("overview.a", b"y%d" % i)
            for msg in await sub.fetch(10 + 5 * burst, timeout=5):
                await msg.ack()
            await asyncio.sleep(0.5)
        await _eventually(lambda: _is(page.locator('[data-card="Consumers"] .value'), "1"))
        assert not page.js_errors
        await _shot(page, "dashboard-overview")
    finally:
        await nc.close()


async def test_stream_page_lists_messages_just_published(
    server: RunningServer, browser: Any
) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        await js.add_consumer("ORDERS", api.ConsumerConfig(durable_name="billing"))
        for i in range(5):
            await js.publish(
                f"orders.eu.{i}",
                json.dumps({"order": i, "total": 10 * i}).encode(),
                headers={"Trace-Id": f"t-{i}"},
            )
        await js.publish("orders.binary", bytes(range(8)))
        page = await _page(browser, server.http_url + "/ui/#/stream/ORDERS")
        row = page.locator('tr[data-seq="5"]')
        await row.wait_for()
        text = await row.inner_text()
        assert "orders.eu.4" in text and "Trace-Id: t-4" in text and '"total": 40' in text
        assert await page.locator('tr[data-seq="6"] pre').inner_text() == "00 01 02 03 04 05 06 07"
        assert "billing" in await page.locator('tr[data-consumer="billing"]').inner_text()
        await _shot(page, "dashboard-stream")
        # By subject: only what the filter matches.
        await page.fill("#subject-filter", "orders.eu.1")
        await page.press("#subject-filter", "Enter")
        await page.locator('tr[data-seq="5"]').wait_for(state="detached")
        assert await page.locator("tr[data-seq]").count() == 1
        assert not page.js_errors
    finally:
        await nc.close()


async def test_consumer_lag_drops_after_acks(server: RunningServer, browser: Any) -> None:
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="LAG", subjects=["lag.>"])
        for i in range(20):
            await js.publish("lag.x", b"%d" % i)
        sub = await js.pull_subscribe("lag.x", durable="worker", stream="LAG")
        page = await _page(browser, server.http_url + "/ui/#/consumer/LAG/worker")
        lag = page.locator('[data-card="Lag (pending)"] .value')
        await _eventually(lambda: _is(lag, "20"))
        msgs = await sub.fetch(15, timeout=5)
        for msg in msgs:
            await msg.ack_sync()
        await _eventually(lambda: _is(lag, "5"))
        assert await _text(page, '[data-card="Ack pending"] .value') == "0"
        await page.wait_for_timeout(1200)  # a few more samples on the chart
        await _shot(page, "dashboard-consumer")
        # The streams list shows the same lag.
        await page.goto(server.http_url + "/ui/#/streams")
        await page.locator('tr[data-stream="LAG"]').wait_for()
        assert not page.js_errors
    finally:
        await nc.close()


async def _is(locator: Any, expected: str) -> bool:
    return bool(await locator.inner_text() == expected)


async def test_requeue_dead_letter_from_the_page(server: RunningServer, browser: Any) -> None:
    nc = await nats.connect(server.url)
    try:
        sub = await dead_letter(nc.jetstream(), "DLQ", "dlq.job", "handler", b"poison")
        page = await _page(browser, server.http_url + "/ui/#/consumer/DLQ/handler")
        row = page.locator('tr[data-dead="1"]')
        await row.wait_for()
        assert "dlq.job" in await row.inner_text()
        await _shot(page, "dashboard-dead-letters")
        await row.get_by_role("button", name="Requeue").click()
        await row.wait_for(state="detached")
        again = (await sub.fetch(1, timeout=5))[0]
        assert again.data == b"poison"
        await again.ack_sync()
        assert not page.js_errors
    finally:
        await nc.close()


async def test_dead_jobs_page(server: RunningServer, browser: Any) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        form = {"content-type": "application/x-www-form-urlencoded"}
        assert (await http.put("/channel/shop", data={"token": "ct"}, headers=form)).is_success
        assert (await http.put("/producer/web", data={"token": "pt"}, headers=form)).is_success
        r = await http.put(
            "/channel/shop/consumer/mailer",
            data={"token": "kt", "callbackUrl": "http://127.0.0.1:9/", "type": "pull"},
            headers=form,
        )
        assert r.is_success, r.text
        r = await http.post(
            "/channel/shop/broadcast",
            content=b"hello",
            headers={
                "x-broker-channel-token": "ct",
                "x-broker-producer-id": "web",
                "x-broker-producer-token": "pt",
                "content-type": "text/plain",
            },
        )
        assert r.is_success, r.text
        # The job goes in flight, then the consumer gives up on it: a dead job.
        tokens = {"x-broker-channel-token": "ct", "x-broker-consumer-token": "kt"}
        base = "/channel/shop/consumer/mailer"
        jobs = (await http.get(base + "/queued-jobs", headers=tokens)).json()["Result"]
        job = jobs[0]["ID"]
        for state in ("INFLIGHT", "DEAD"):
            r = await http.post(f"{base}/job/{job}", json={"NextState": state}, headers=tokens)
            assert r.is_success, r.text
        page = await _page(browser, server.http_url + "/ui/#/jobs")
        row = page.locator('tr[data-job-consumer="mailer"]')
        await row.wait_for()
        assert "pull" in await row.inner_text()
        dead = page.locator(f'[data-job="{job}"]')
        await dead.wait_for()
        await _shot(page, "dashboard-jobs")
        await dead.get_by_role("button", name="Requeue").click()
        await dead.wait_for(state="detached")
        jobs = (await http.get(base + "/queued-jobs", headers=tokens)).json()["Result"]
        assert [j["ID"] for j in jobs] == [job]
        assert not page.js_errors


async def test_nsq_and_connections_pages(server: RunningServer, browser: Any) -> None:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        assert (await http.post("/pub?topic=clicks", content=b"one")).is_success
        r = await http.post("/channel/create?topic=clicks&channel=archive")
        assert r.is_success, r.text
    nc = await nats.connect(server.url, name="dashboard-test")
    try:
        page = await _page(browser, server.http_url + "/ui/#/nsq")
        await page.get_by_text("Topic clicks").wait_for()
        assert "archive" in await page.locator("table").first.inner_text()
        await page.goto(server.http_url + "/ui/#/connections")
        await page.get_by_text("dashboard-test").wait_for()
        await _shot(page, "dashboard-connections")
        assert not page.js_errors
    finally:
        await nc.close()


async def test_read_only_mode_refuses_actions(browser: Any) -> None:
    with run_server(args=["--config", str(_config("ui_read_only = true"))]) as srv:
        nc = await nats.connect(srv.url)
        try:
            js = nc.jetstream()
            await dead_letter(js, "RO", "ro.a")
            page = await _page(browser, srv.http_url + "/ui/#/consumer/RO/c")
            row = page.locator('tr[data-dead="1"]')
            await row.wait_for()
            assert await row.get_by_role("button", name="Requeue").is_disabled()
            assert "read-only" in await page.locator("#session").inner_text()
            # The server refuses too, CSRF token and all.
            status = await page.evaluate(
                """async () => {
                    const s = await (await fetch('/ui/api/session')).json();
                    const r = await fetch('/ui/api/streams/RO/consumers/c/dead/requeue', {
                        method: 'POST', body: '{}',
                        headers: {'content-type': 'application/json', 'x-tether-csrf': s.csrf}});
                    return [r.status, (await r.json()).error];
                }"""
            )
            assert status[0] == 403 and "read-only" in status[1]
            info = await js.consumer_info("RO", "c")
            assert info.num_pending == 0 and info.num_ack_pending == 0
        finally:
            await nc.close()


async def test_actions_need_credentials_and_csrf(browser: Any) -> None:
    with run_server(args=["--config", str(_config('http_admin_password = "s3cret"'))]) as srv:
        nc = await nats.connect(srv.url)
        try:
            sub = await dead_letter(nc.jetstream(), "AUTH", "auth.a")
            url = srv.http_url + "/ui/api/streams/AUTH/consumers/c/dead/requeue"
            async with httpx.AsyncClient() as http:
                token = (await http.get(srv.http_url + "/ui/api/session")).json()["csrf"]
                no_csrf = await http.post(url, json={}, auth=("admin", "s3cret"))
                assert no_csrf.status_code == 403
                no_creds = await http.post(url, json={}, headers={"x-tether-csrf": token})
                assert no_creds.status_code == 401
                other_site = await http.post(
                    url,
                    json={},
                    auth=("admin", "s3cret"),
                    headers={"x-tether-csrf": token, "origin": "http://evil.example"},
                )
                assert other_site.status_code == 403
            page = await _page(browser, srv.http_url + "/ui/#/consumer/AUTH/c")
            row = page.locator('tr[data-dead="1"]')
            await row.wait_for()
            assert await row.get_by_role("button", name="Requeue").is_disabled()
            await page.fill("#login-password", "s3cret")
            await page.get_by_role("button", name="Sign in").click()
            await page.locator("#session").get_by_text("signed in as admin").wait_for()
            button = page.locator('tr[data-dead="1"]').get_by_role("button", name="Requeue")
            await _eventually(button.is_enabled)
            await button.click()
            await page.locator('tr[data-dead="1"]').wait_for(state="detached")
            assert (await sub.fetch(1, timeout=5))[0].data == b"x"
        finally:
            await nc.close()


async def test_api_docs_page(server: RunningServer, browser: Any) -> None:
    page = await _page(browser, server.http_url + "/docs")
    await page.locator(".swagger-ui .info .title").wait_for()
    assert "Tether" in await page.locator(".swagger-ui .info .title").inner_text()
    # Every asset came from this server: no CDN.
    assert not page.js_errors


def _config(line: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="tether-ui-")) / "tether.toml"
    path.write_text(line + "\n")
    return path
