"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright)
against a real router process fed by simulated sensors.

The router runs with clocks the test can move (tests/fakeclock), so six hours of history
are seeded in a second: the chart's time ranges and get_events paging are exercised on real
stored timestamps. Its wall clock is not synchronized (the kernel's state stands in): ages
still show, from CLOCK_BOOTTIME. Every page load collects console messages, page errors and the
WebSocket frames: the page must speak JSON only and log no error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import pytest_asyncio
from autobahn.wamp.types import PublishOptions

from cairn.gateway.core.session import Sequence
from cairn.gateway.ops.config_history import PROVISIONING, History
from cairn.gateway.store import Store, StoredPublication
from harness.config import EVERYTHING, history_rule, permission, realm, role, user
from harness.process import ROOT, RouterProcess
from harness.wamp_client import connect

CHROMIUM = Path("/usr/bin/chromium")
BUNDLE = ROOT / "gateway" / "dashboard" / "autobahn.min.js"
ARTIFACTS = ROOT / "test-artifacts"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(),
                       reason="the dashboard tests need Debian's chromium at /usr/bin/chromium "
                              "(apt-get install chromium; `scripts/setup.sh test` does it)"),
    pytest.mark.asyncio(loop_scope="module"),
]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

REALMS = (realm("realm1", role("anonymous", permission("", EVERYTHING)), history_rule("sensor"),
                anonymous_role="anonymous")
          + realm("locked", role("operator", permission("", EVERYTHING)),
                  user("olga", "operator", secret="granite-7"), history_rule("sensor")))

MINUTE = 60
DAY = 24 * 60 * MINUTE  # CLOCK_BOOTTIME's head start: readings "hours ago" stay in this boot
SEEDED = range(-355, 0, 10)  # minutes before now: a reading every 10 min for 6 h
PAGE = 7                     # ?history_page: small, so the chart pages through get_events


@dataclass
class Device:
    id: str
    base_t: float
    base_h: float
    last_minutes: int = 0     # its last reading this many minutes ago (0: now)
    status: str = "ok"
    reason: str | None = None
    published: list[dict] = field(default_factory=list)  # (minutes ago, kwargs), in order

    def reading(self, minutes: float) -> dict:
        day = math.sin((minutes + 120) / 240 * math.pi)
        wobble = math.sin(minutes / 23.0 + len(self.id))
        return {"temperature": round(self.base_t + 2.8 * day + 0.4 * wobble, 1),
                "humidity": round(self.base_h - 6 * day + 1.5 * wobble, 1)}


DEVICES = [
    Device("cellar", 11.2, 82),
    Device("greenhouse", 23.5, 66),
    Device("hive-north", 34.1, 57),
    Device("pantry", 16.4, 52, last_minutes=25, status="stale",
           reason="no reading for 25 min"),
    Device("attic", 19.0, 40, last_minutes=65, status="error",
           reason="Modbus address 3: no reply"),
    Device("workshop", 17.6, 45),
]
BY_ID = {d.id: d for d in DEVICES}


class Sensors:
    """The router process with movable clocks, and a publishing WAMP session."""

    def __init__(self, router: RouterProcess, workdir: Path) -> None:
        self.router = router
        self.workdir = workdir
        self.session = None

    def set_clocks(self, wall_s: float = 0, boot_s: float = 0) -> None:
        """Moves the router's wall clock and CLOCK_BOOTTIME by so many seconds."""
        (self.workdir / "clock-offset").write_text(str(wall_s))
        (self.workdir / "boottime-offset").write_text(str(DAY + boot_s))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router.port}/"

    async def publish(self, device: Device, minutes_ago: int, kwargs: dict | None = None) -> None:
        kwargs = kwargs or device.reading(minutes_ago)
        await self.session.publish(f"sensor.{device.id}", options=PublishOptions(
            retain=True, acknowledge=True), **kwargs)
        device.published.append({"minutes_ago": minutes_ago, **kwargs})

    async def seed(self) -> None:
        for minutes in SEEDED:  # the router's clocks are moved back to make the old readings
            self.set_clocks(minutes * MINUTE, minutes * MINUTE)
            await asyncio.gather(*(self.publish(d, minutes) for d in DEVICES
                                   if minutes <= -d.last_minutes))
        self.set_clocks()
        await asyncio.gather(*(self.publish(d, 0) for d in DEVICES if d.last_minutes == 0))
        for d in DEVICES:
            await self.session.publish(
                f"gateway.device.{d.id}.status", status=d.status, reason=d.reason,
                since=round(time.time() - d.last_minutes * MINUTE),
                options=PublishOptions(retain=True, acknowledge=True))
        # what the uploader (sync/) leaves for the status strip
        (self.router.data_dir / "sync-status.json").write_text(json.dumps({
            "gateway_id": "cairn-test", "sink": "dir:/mnt/uplink", "state": "ok",
            "synced_seq": 0, "backlog": 0, "last_attempt": None, "last_error": None,
            "last_success": time.strftime("%Y-%m-%dT%H:%M:%S.000Z",
                                          time.gmtime(time.time() - 4 * MINUTE)),
            "rate_events_per_s": None, "batches": 3, "events": 200}))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sensors(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("dashboard")
    env = {"CAIRN_FAKE_CLOCK_FILE": str(workdir / "clock-offset"),
           "CAIRN_FAKE_BOOTTIME_FILE": str(workdir / "boottime-offset"),
           "CAIRN_FAKE_CLOCK_SYNCED": "0",
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    router = RouterProcess(workdir, REALMS, env=env)
    sensors = Sensors(router, workdir)
    # the router starts as of the oldest seeded reading: its health record at start is
    # history's first row, and would otherwise be newer than the readings after it
    sensors.set_clocks(min(SEEDED) * MINUTE, min(SEEDED) * MINUTE)
    router.start()
    try:
        sensors.session = await connect(router)
        await sensors.seed()
        locked = await connect(router, realm="locked", authmethods=["ticket"], authid="olga",
                               secret="granite-7")
        await locked.publish("sensor.vault", temperature=14.0, humidity=61.0,
                             options=PublishOptions(retain=True, acknowledge=True))
        await locked.leave()
        yield sensors
        with contextlib.suppress(Exception):
            await sensors.session.leave()
    finally:
        router.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(tmp_path_factory):
    from playwright.async_api import async_playwright

    assert BUNDLE.exists(), f"{BUNDLE} is missing: run scripts/setup.sh (it builds it with npm)"
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM),
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1440, "height": 900},
            device_scale_factor=1)
        yield context
        await context.close()


class Watched:
    """A page with everything it logged and every WebSocket frame it sent or received."""

    def __init__(self, page) -> None:
        self.page = page
        self.console: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self.sent: list[str | bytes] = []
        self.received: list[str | bytes] = []
        self.allowed: list[str] = []  # console errors a test expects (regular expressions)
        page.on("console", lambda msg: self.console.append((msg.type, msg.text)))
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("websocket", self._websocket)

    def _websocket(self, ws) -> None:
        ws.on("framesent", lambda payload: self.sent.append(payload))
        ws.on("framereceived", lambda payload: self.received.append(payload))

    def calls(self, procedure: str) -> list[list]:
        messages = [json.loads(frame) for frame in self.sent if isinstance(frame, str)]
        return [msg for msg in messages if msg[0] == 48 and msg[3] == procedure]

    def check(self) -> None:
        problems = [text for kind, text in self.console if kind == "error"
                    and not any(re.search(allowed, text) for allowed in self.allowed)]
        problems += self.errors
        assert not problems, f"console errors: {problems}"
        frames = self.sent + self.received
        assert frames, "the page exchanged no WebSocket frames"
        for frame in frames:  # wamp.2.json: text frames, each one JSON array
            assert isinstance(frame, str), f"binary frame: {frame[:40]!r}"
            assert isinstance(json.loads(frame), list)
        assert json.loads(self.sent[0])[0] == 1  # HELLO


@pytest_asyncio.fixture(loop_scope="module")
async def open_page(browser):
    pages: list[Watched] = []

    async def open_(url: str, width: int = 1440, height: int = 900) -> Watched:
        page = await browser.new_page()
        await page.set_viewport_size({"width": width, "height": height})
        watched = Watched(page)
        pages.append(watched)
        await page.goto(url)
        return watched

    yield open_
    for watched in pages:
        await watched.page.close()
    for watched in pages:
        watched.check()


async def tiles(page) -> dict[str, dict[str, str]]:
    return await page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('.tile')].map(t => [t.dataset.device, {
            temperature: t.querySelector('[data-field=temperature]').textContent,
            humidity: t.querySelector('[data-field=humidity]').textContent,
            status: t.querySelector('.badge').textContent,
            age: t.querySelector('.age').textContent,
            reason: t.querySelector('.reason').textContent}]))""")


def shown(kwargs: dict) -> tuple[str, str]:
    """As the page shows a reading (JavaScript's toFixed rounds halves up)."""
    def fixed(value: float, places: str) -> str:
        return str(Decimal(repr(value)).quantize(Decimal(places), ROUND_HALF_UP))
    return fixed(kwargs["temperature"], "0.1"), fixed(kwargs["humidity"], "1")


async def test_the_router_serves_the_dashboard_and_its_assets(sensors):
    def get(path: str, method: str = "GET"):
        request = urllib.request.Request(sensors.url.rstrip("/") + path, method=method)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.headers["Content-Type"], response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers["Content-Type"], e.read()

    status, kind, body = get("/")
    assert (status, kind) == (200, "text/html; charset=utf-8") and b"<title>Cairn" in body
    assert get("/dashboard/app.js")[:2] == (200, "text/javascript; charset=utf-8")
    assert get("/dashboard/style.css")[:2] == (200, "text/css; charset=utf-8")
    assert get("/dashboard/icon.svg")[:2] == (200, "image/svg+xml")
    status, kind, body = get("/dashboard/autobahn.min.js")
    assert (status, body) == (200, BUNDLE.read_bytes())
    assert get("/dashboard/autobahn.min.js", "HEAD")[2] == b""
    for path in ("/dashboard/../server.py", "/dashboard/%2e%2e/server.py", "/dashboard/",
                 "/dashboard/package.json", "/dashboard/node_modules/autobahn-browser/LICENSE",
                 "/dashboard/.hidden.js", "/../gateway/server.py", "/server.py"):
        assert get(path)[0] == 404, path
    assert get("/", "POST")[0] == 405
    assert get("/status")[2].startswith(b"Cairn router")


async def test_tiles_show_the_retained_values_within_a_second_of_load(sensors, open_page):
    watched = await open_page(sensors.url)
    # goto() returned at the load event: every device's tile must be filled within 1 s
    await watched.page.wait_for_function(
        """n => [...document.querySelectorAll('.tile')].filter(t =>
                t.querySelector('[data-field=temperature]').textContent !== '–'
                && t.dataset.status !== 'none').length === n""",
        arg=len(DEVICES), timeout=1000)
    shown_tiles = await tiles(watched.page)
    assert sorted(shown_tiles) == sorted(BY_ID)  # one tile per device, in id order
    for device in DEVICES:
        tile = shown_tiles[device.id]
        assert (tile["temperature"], tile["humidity"]) == shown(device.published[-1])
        assert tile["status"] == device.status
        assert tile["reason"] == (device.reason or "")
    # ages by receive time, which the router tells for retained readings
    await watched.page.wait_for_function(
        "() => document.querySelector('[data-device=attic] .age').textContent.endsWith('ago')",
        timeout=3000)
    shown_tiles = await tiles(watched.page)
    assert shown_tiles["pantry"]["age"] == "25 min ago"
    assert shown_tiles["attic"]["age"] == "1 h 5 min ago"
    assert shown_tiles["greenhouse"]["age"] in ("just now", *(f"{s} s ago" for s in range(60)))


async def test_a_tile_shows_the_age_by_boottime_while_the_wall_clock_is_unsynchronized(
        sensors, open_page):
    sensors.set_clocks(wall_s=-40, boot_s=-40)  # a reading 40 s ago
    try:
        await sensors.publish(Device("shed", 8.0, 70), 0)
        sensors.set_clocks(wall_s=5 * 3600)  # then the wall clock is set 5 h ahead
        watched = await open_page(sensors.url)
        age = watched.page.locator("[data-device=shed] .age")
        await watched.page.wait_for_function(
            "() => document.querySelector('[data-device=shed] .age')?.textContent.endsWith('ago')",
            timeout=3000)
        assert re.fullmatch(r"4\d s ago", await age.text_content())
        await watched.page.wait_for_selector("#clock-banner", state="visible", timeout=3000)
        assert (await age.get_attribute("title")).endswith("(gateway clock not synchronized)")
    finally:
        sensors.set_clocks()


async def test_a_tile_updates_when_a_new_reading_is_published(sensors, open_page):
    watched = await open_page(sensors.url)
    page = watched.page
    await page.wait_for_selector("[data-device=cellar] [data-field=temperature]:not(:empty)")
    await sensors.publish(BY_ID["cellar"], 0, {"temperature": 9.4, "humidity": 88.0})
    await page.wait_for_function(
        """() => document.querySelector('[data-device=cellar] [data-field=temperature]')
                 .textContent === '9.4'""", timeout=2000)
    tile = (await tiles(page))["cellar"]
    assert (tile["humidity"], tile["age"]) == ("88", "just now")
    # a device seen for the first time gets a tile of its own
    await sensors.session.publish("sensor.boathouse", temperature=-2.5, humidity=91.0,
                                  options=PublishOptions(acknowledge=True))
    await page.wait_for_selector("[data-device=boathouse]", timeout=2000)
    assert (await tiles(page))["boathouse"]["temperature"] == "−2.5"


async def chart_points(page) -> dict[str, int]:
    return await page.evaluate("""() => Object.fromEntries(
        [...document.querySelectorAll('.chart')].map(f => {
            const line = f.querySelector('polyline');
            return [f.dataset.series,
                    line ? line.getAttribute('points').trim().split(/\\s+/).length : 0];
        }))""")


async def test_the_chart_pages_through_the_stored_history(sensors, open_page):
    device = BY_ID["greenhouse"]
    watched = await open_page(f"{sensors.url}?history_page={PAGE}")
    page = watched.page
    await page.click("[data-device=greenhouse]")
    in_hour = [p for p in device.published if p["minutes_ago"] > -60]
    await page.wait_for_function(
        "n => document.querySelector('#chart-temperature svg')?.dataset.points === String(n)",
        arg=len(in_hour), timeout=3000)
    assert await chart_points(page) == {"temperature": len(in_hour), "humidity": len(in_hour)}

    await page.click("button[data-range='86400000']")  # 24 h: all six hours of readings
    total = len(device.published)
    await page.wait_for_function(
        "n => document.querySelector('#chart-temperature svg')?.dataset.points === String(n)",
        arg=total, timeout=3000)
    assert await chart_points(page) == {"temperature": total, "humidity": total}
    pages = math.ceil(total / PAGE)
    assert f"{total} readings in the last 24 h · read in {pages} pages" in \
        await page.text_content("#detail-foot")
    calls = watched.calls("wamp.subscription.get_events")
    sub_id = (await sensors.session.call("wamp.subscription.lookup", "sensor",
                                         {"match": "prefix"}))
    paged = [c for c in calls if "before_publication" in c[5]]
    assert len(paged) >= pages - 1
    for call in paged:
        assert call[4] == [sub_id]
        assert {**call[5], "before_publication": 0} == {
            "reverse": True, "limit": PAGE, "topic": "sensor.greenhouse", "before_publication": 0}
    # the newest point is the newest reading; the values drawn are the stored ones
    last = device.published[-1]
    caption = await page.text_content("#chart-temperature figcaption")
    assert f"{last['temperature']:.1f} °C" in caption
    values = [p["temperature"] for p in device.published]
    assert f"min {min(values):.1f} · max {max(values):.1f}" in caption

    # a new reading is appended to the open chart
    await sensors.publish(device, 0)
    await page.wait_for_function(
        "n => document.querySelector('#chart-temperature svg')?.dataset.points === String(n)",
        arg=total + 1, timeout=2000)

    ARTIFACTS.mkdir(exist_ok=True)
    await page.wait_for_timeout(1000)  # the tile's flash animation
    await page.mouse.move(0, 0)
    await page.screenshot(path=ARTIFACTS / "dashboard.png", full_page=True)
    if os.environ.get("CAIRN_UPDATE_DOCS_SCREENSHOT"):
        shutil.copy(ARTIFACTS / "dashboard.png", ROOT / "docs" / "dashboard.png")


async def test_the_status_strip_shows_the_routers_figures(sensors, open_page):
    watched = await open_page(sensors.url)
    page = watched.page
    seen = []
    for _ in range(40):  # the page refreshes every 5 s; sessions of closed pages may linger
        status = await sensors.session.call("cairn.router.status")
        seen.append((await page.text_content("#st-sessions"), status["sessions"]))
        if seen[-1][0] == str(status["sessions"]):
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(f"sessions shown vs the router's: {seen}")
    strip = {name: await page.text_content(f"#st-{name}")
             for name in ("uptime", "sessions", "store", "history", "sync", "clock", "card")}
    assert re.fullmatch(r"\d+(\.\d)? (KB|MB) [\d,]+ events", strip["store"]), strip["store"]
    events = int(strip["store"].split()[-2].replace(",", ""))
    assert events == status["store"]["events"]
    assert strip["history"].startswith("5 h 55 min")  # oldest to newest reading
    assert strip["sync"] == "ok · 0 waiting last upload 4 min ago"
    synced = status["clock"]["synchronized"]
    assert strip["clock"] == ("synchronized" if synced else "not synchronized")
    assert await page.is_hidden("#clock-banner") == synced
    assert re.fullmatch(r"\d+ (s|min)", strip["uptime"]), strip["uptime"]
    # a router that has just started projects no card life: it says how long it has measured
    assert re.fullmatch(r"measuring… \d+ (s|min) of 1 h", strip["card"]), strip["card"]
    # refreshed every few seconds
    before = strip["sessions"]
    other = await connect(sensors.router)
    try:
        await page.wait_for_function(
            "n => document.querySelector('#st-sessions').textContent === n",
            arg=str(int(before) + 1), timeout=7000)
    finally:
        await other.leave()


async def test_without_anonymous_access_the_page_asks_for_a_ticket_login(sensors, open_page):
    watched = await open_page(sensors.url + "?realm=locked")
    page = watched.page
    await page.wait_for_selector("#login-form", state="visible", timeout=3000)
    assert await page.is_hidden("#login-error")
    assert await page.text_content("#st-sync") == "–"

    await page.fill("#login-authid", "olga")
    await page.fill("#login-secret", "basalt")
    await page.click("#login-submit")
    await page.wait_for_selector("#login-error", state="visible", timeout=3000)
    assert "Wrong user or secret" in await page.text_content("#login-error")

    await page.fill("#login-secret", "granite-7")
    await page.click("#login-submit")
    await page.wait_for_selector("[data-device=vault]", timeout=3000)
    assert await page.is_hidden("#login")
    assert (await tiles(page))["vault"]["temperature"] == "14.0"
    assert await page.text_content("#realm") == "locked · olga"
    assert await page.is_visible("#signout")
    hellos = [json.loads(f) for f in watched.sent if isinstance(f, str) and f.startswith("[1,")]
    assert [h[2].get("authmethods") for h in hellos] == [None, ["ticket"], ["ticket"]]
    assert hellos[-1][2]["authid"] == "olga"
    await page.wait_for_function(  # the status strip of the realm, for its user
        "() => document.querySelector('#st-sessions').textContent === '1'", timeout=3000)


async def test_the_page_fits_a_phone_screen(sensors, open_page):
    watched = await open_page(sensors.url + "#hive-north", width=390, height=844)
    page = watched.page
    await page.wait_for_function(
        "() => document.querySelector('#chart-humidity svg polyline')", timeout=3000)
    overflow = await page.evaluate(
        "() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow}px wider than a phone screen"
    columns = await page.evaluate(
        "() => getComputedStyle(document.querySelector('#tiles'))"
        ".gridTemplateColumns.split(' ').length")
    assert columns == 1
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "dashboard-phone.png", full_page=True)


async def seed_earlier_boot(db: Path, topic: str, wall_ms: int, kwargs: dict) -> None:
    """A store holding one retained reading of ``topic`` received in another boot of the
    gateway (its boot id is not this machine's), by an unsynchronized wall clock."""
    store = await Store.open(db)
    try:
        seq, publication = Sequence(store.next_seq, store.publication_ids).assign()
        store.append(StoredPublication(
            seq=seq, publication=publication, realm="realm1", topic=topic, args=[],
            kwargs=kwargs, wall_ms=wall_ms, boot_id="an-earlier-boot",
            boottime_ns=3600 * 10**9, clock_synced=False, authid="anonymous-1",
            authrole="anonymous", details={"topic": topic}, history_rule=0, retain=True))
    finally:
        await store.close()


WALL_MS_BEFORE_REBOOT = round((time.time() - 3 * 3600) * 1000)  # received 3 h ago


@pytest_asyncio.fixture(loop_scope="module")
async def rebooted(tmp_path):
    """A router whose store holds a reading of an earlier boot (and no synchronized clock
    now); asked for before open_page, it stops after the pages are closed."""
    router = RouterProcess(tmp_path, REALMS, env={
        "CAIRN_FAKE_CLOCK_SYNCED": "0", "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"})
    await seed_earlier_boot(router.db_path, "sensor.smokehouse", WALL_MS_BEFORE_REBOOT,
                            {"temperature": 31.5, "humidity": 20.0})
    router.start()
    yield router
    router.stop()


async def test_a_reading_of_an_earlier_boot_shows_its_time_with_a_note_while_unsynchronized(
        rebooted, open_page):
    watched = await open_page(f"http://127.0.0.1:{rebooted.port}/")
    page = watched.page
    await page.wait_for_selector("#clock-banner", state="visible", timeout=3000)
    await page.wait_for_function(
        "() => document.querySelector('[data-device=smokehouse] .age.unsynced')", timeout=3000)
    age = page.locator("[data-device=smokehouse] .age")
    zone = ZoneInfo(await page.evaluate("Intl.DateTimeFormat().resolvedOptions().timeZone"))
    hh_mm = datetime.fromtimestamp(WALL_MS_BEFORE_REBOOT / 1000, zone).strftime("%H:%M")
    # a time (the gateway's wall clock then), not an age, and the note
    assert re.fullmatch(rf".+ {hh_mm}, clock not synchronized", await age.text_content())
    assert "not synchronized then or now" in await age.get_attribute("title")
    assert (await tiles(page))["smokehouse"]["temperature"] == "31.5"
    assert watched.calls("cairn.retained.received")


ECHO_OVER_CBOR = """(url) => new Promise((resolve, reject) => {
    const sent = new Uint8Array(16350);
    crypto.getRandomValues(sent);
    const connection = new autobahn.Connection({
        url, realm: 'realm1', max_retries: 0,
        serializers: [new autobahn.serializer.CBORSerializer()]});
    connection.onopen = (session) => session.call('test.echo', [sent]).then(
        (back) => {
            resolve({sent: Array.from(sent), back: Array.from(back)});
            connection.close();
        },
        (error) => reject(new Error(JSON.stringify(error))));
    connection.onclose = (reason, details) => {
        reject(new Error(`closed: ${reason} ${JSON.stringify(details)}`));
        return true;  // no reconnect
    };
    connection.open();
})"""


async def test_autobahn_js_over_cbor_calls_with_a_byte_array(sensors, browser):
    """autobahn-js's own test "CBOR large payload": a call whose argument is 16,350 random
    bytes, a Uint8Array that its CBOR encoder sends as a typed array (tag 64). Cairn aborted
    the session with protocol_violation; the bytes must arrive as bytes and come back."""
    received: list[bytes] = []

    def echo(data: bytes) -> bytes:
        received.append(data)
        return data

    registration = await sensors.session.register(echo, "test.echo")
    page = await browser.new_page()
    try:
        await page.goto(sensors.url)
        result = await asyncio.wait_for(page.evaluate(
            ECHO_OVER_CBOR, f"ws://127.0.0.1:{sensors.router.port}/ws"), 20)
    finally:
        await page.close()
        await registration.unregister()
    assert [type(data) for data in received] == [bytes]
    assert list(received[0]) == result["sent"] == result["back"]


async def test_the_page_reconnects_when_the_router_restarts(sensors, open_page):
    """Runs last: it restarts the module's router."""
    watched = await open_page(sensors.url)
    page = watched.page
    # While the router is down, Chromium itself reports the refused WebSocket connections.
    # autobahn-js 22.11 also sends on its socket after answering GOODBYE system_shutdown,
    # although the router keeps the socket open 0.2 s for that reply; Chromium reports it.
    watched.allowed += [r"^WebSocket connection to 'ws://127\.0\.0\.1:\d+/ws' failed",
                        r"^WebSocket is already in CLOSING or CLOSED state\.$"]
    await page.wait_for_selector("#conn[data-state=live]", timeout=3000)
    sensors.router.stop()  # GOODBYE wamp.close.system_shutdown to every session
    await page.wait_for_selector("#conn[data-state=offline]", timeout=3000)
    assert (await tiles(page))["workshop"]["temperature"] != "–"  # last values stay up
    sensors.router.start()
    await page.wait_for_selector("#conn[data-state=live]", timeout=8000)
    sensors.session = await connect(sensors.router)
    await sensors.publish(BY_ID["workshop"], 0, {"temperature": 18.25, "humidity": 44.0})
    await page.wait_for_function(
        """() => document.querySelector('[data-device=workshop] [data-field=temperature]')
                 .textContent === '18.3'""", timeout=2000)


# -- configuration: the fallback banner and the settings page ---------------------------------

ADMIN_REALM = realm("ops", role("admin", permission("cairn.admin", ["call"]),
                                permission("", EVERYTHING)),
                    user("ada", "admin", secret="obsidian-4"))


@contextlib.asynccontextmanager
async def own_router(workdir: Path, bad: str | None = None):
    """A router of this test's own (the module's keeps its config), its config marked as
    the last good one; with ``bad``, the file is then replaced by that text."""
    router = RouterProcess(workdir, REALMS + ADMIN_REALM)
    good = router.config.read_text()
    History(router.config).mark_good(good)
    if bad is not None:
        router.config.write_text(bad.format(good=good))
    router.start()
    try:
        yield router
    finally:
        router.stop()


async def test_the_banner_says_the_router_runs_on_its_last_good_configuration(
        tmp_path, open_page):
    async with own_router(tmp_path, '{good}\n[router.bogus]\n') as router:
        watched = await open_page(f"http://127.0.0.1:{router.port}/")
        banner = watched.page.locator("#config-banner")
        await banner.wait_for(state="visible", timeout=5000)
        text = await banner.text_content()
        await watched.page.close()  # before the router stops: no reconnect errors
    assert text.startswith("Running on the last good configuration: ")
    assert f"{router.config}: router.bogus: unknown key" in text


async def test_the_banner_says_the_boot_partitions_settings_were_refused_and_why(
        tmp_path, open_page):
    """`cairn provision` records a refused folder beside the config (PROVISIONING): the
    router runs on as it was and the dashboard says what the card's report says."""
    async with own_router(tmp_path) as router:
        (router.config.parent / PROVISIONING).write_text(json.dumps({
            "at": "2026-11-27T10:00:00+00:00", "boot_id": "b", "outcome": "refused",
            "problems": ["hostname: -: 'two words' is not a host name"]}))
        watched = await open_page(f"http://127.0.0.1:{router.port}/")
        banner = watched.page.locator("#config-banner")
        await banner.wait_for(state="visible", timeout=5000)
        text = await banner.text_content()
        await watched.page.close()
    assert text.startswith("The settings on the card's boot partition were not applied "
                           "(refused; see cairn/report.txt there): ")
    assert "hostname: -: 'two words' is not a host name" in text


async def test_the_settings_page_shows_the_config_and_a_refusal_with_its_key(
        tmp_path, open_page):
    async with own_router(tmp_path) as router:
        watched = await open_page(f"http://127.0.0.1:{router.port}/?realm=ops")
        page = watched.page
        await page.wait_for_selector("#login-form", state="visible", timeout=3000)
        await page.fill("#login-authid", "ada")
        await page.fill("#login-secret", "obsidian-4")
        await page.click("#login-submit")
        await page.click("#settings-open", timeout=5000)
        await page.wait_for_function(
            "() => document.querySelector('#settings-text').value.includes('[[realms]]')",
            timeout=3000)
        shown = await page.input_value("#settings-text")  # no secret: get redacts them
        assert shown == router.config.read_text().replace('"granite-7"', '"<redacted>"') \
            .replace('"obsidian-4"', '"<redacted>"')
        assert await page.is_hidden("#config-banner")
        await page.fill("#settings-text", shown.replace(
            'name = "ops"', 'name = "ops"\nhistory_rules = 3'))
        await page.click("#settings-apply")
        result = page.locator("#settings-result[data-kind=error]")
        await result.wait_for(timeout=3000)
        text = await result.text_content()
        await page.close()
    assert text.startswith(f"Not applied: {router.config}: realms[2].history_rules: "
                           f"unknown key")
    assert not (router.data_dir / "config-requests").exists()
