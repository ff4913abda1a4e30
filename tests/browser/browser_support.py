"""What the console's browser tests share (``conftest.py`` makes the fixtures here visible):
a headless Chromium driven by Selenium (Debian's ``chromium`` and ``chromium-driver``), the
console served by uvicorn in a thread of the test process, worker processes of
``console_app.py`` over one SQLite file, and screenshots.

Selenium rather than Playwright: Debian's ``chromium-driver`` is built from the same source as
its ``chromium``, so driver and browser always match, and Selenium is a pure-Python package;
Playwright drives a browser through its own Node.js driver tuned to the Chromium build it
downloads, which cannot be downloaded here, and an older or newer system Chromium is not
supported by it.

Without the browser (or Selenium) the tests skip, saying what to install; with ``CI`` set they
fail instead. Screenshots go to a temporary directory, or, those the docs show, to
``SHOAL_SCREENSHOTS`` (what ``./dev screenshots`` sets to docs/img/console).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integration"))

import harness

CHROMIUM = os.environ.get("SHOAL_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SHOAL_CHROMEDRIVER", "/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parent.parent.parent
WIDE = (1280, 800)
PHONE = (390, 844)
# the browser's time zone: not UTC, so that a page showing UTC where it should show local time
# fails the tests
ZONE = "America/New_York"

T = TypeVar("T")


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: ./dev installs the dev extra (pip install -e '.[dev]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return (f"{path} is missing: install Debian's browser and its driver "
                    f"(apt-get install chromium chromium-driver)")
    return None


@pytest.fixture(scope="session")
def driver() -> Iterator[Any]:
    """One headless Chromium for the session, at 1280x800 in :data:`ZONE`."""
    why = missing_browser()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"The browser tests must run in CI: {why}.")
        pytest.skip(f"No browser for the console's browser tests: {why}.")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", "--force-device-scale-factor=1", "--lang=en-US",
                "--disable-extensions", "--no-first-run", f"--window-size={WIDE[0]},{WIDE[1]}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        browser.set_page_load_timeout(30)
        browser.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ZONE})
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def browser(driver: Any) -> Iterator[Any]:
    """The session's browser, wide, with no cookies and one tab, for one test."""
    wide(driver)
    driver.get_log("browser")   # reading the log empties it: the test sees its own entries
    yield driver
    for handle in driver.window_handles[1:]:
        driver.switch_to.window(handle)
        driver.close()
    driver.switch_to.window(driver.window_handles[0])
    driver.delete_all_cookies()
    driver.get("about:blank")


def wide(driver: Any) -> None:
    """A desktop's viewport: 1280x800."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": WIDE[0], "height": WIDE[1], "deviceScaleFactor": 1, "mobile": False})


def phone(driver: Any) -> None:
    """A phone's viewport: 390x844, touch layout (the page's meta viewport applies)."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
        "width": PHONE[0], "height": PHONE[1], "deviceScaleFactor": 1, "mobile": True})


class Shots:
    """Screenshots: every one to a temporary directory; or, when ``SHOAL_SCREENSHOTS`` names a
    directory (``./dev screenshots``: docs/img/console), only those the docs show."""

    def __init__(self, path: Path, docs_only: bool) -> None:
        self.path, self.docs_only = path, docs_only

    def take(self, driver: Any, name: str, *, docs: bool = False, full: bool = False) -> None:
        """Save what the browser shows as ``NAME.png``: the viewport (1280x800 wide, 390x844 on
        a phone), or with ``full`` the whole page's height (at most 2,400 px)."""
        if self.docs_only and not docs:
            return
        path = self.path / f"{name}.png"
        if not full:
            driver.save_screenshot(str(path))
            return
        width, height = driver.execute_script(
            "return [window.innerWidth, document.documentElement.scrollHeight]")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": min(int(height), 2400), "deviceScaleFactor": 1,
            "mobile": width < 600})
        try:
            driver.save_screenshot(str(path))
        finally:
            (phone if width < 600 else wide)(driver)


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Shots:
    target = os.environ.get("SHOAL_SCREENSHOTS")
    path = (ROOT / target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return Shots(path, docs_only=bool(target))


def wait_for(check: Callable[[], T], timeout: float, what: str, step: float = 0.1) -> T:
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout``
    seconds (a bound, not a speed check)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except Exception as e:   # a page in the middle of loading: try again
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}"
                                 + (f" (last error: {last!r})" if last else ""))
        time.sleep(step)


# -- the console, served in this process --------------------------------------------------------


class ConsoleServer:
    """An ASGI app (by default ``shoal.web.asgi(store, **options)``) served by uvicorn on a free
    loopback port, in a thread with its own event loop (the tests' Selenium calls block)."""

    def __init__(self, store: str | None = None, *, asgi_app: Any = None,
                 **options: Any) -> None:
        import uvicorn

        from shoal.web import asgi

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        served = asgi_app if asgi_app is not None else asgi(store, **options)
        config = uvicorn.Config(served, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self) -> ConsoleServer:
        self.thread.start()
        wait_for(lambda: self.server.started or not self.thread.is_alive(), 30,
                 "the console to start")
        assert self.server.started, "the console did not start (see the log above)"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


# -- the shop: worker processes of console_app.py over one SQLite file ---------------------------


class Shop:
    """A SQLite store, the worker processes serving it, and a way to act on it from the test
    (an App connected only, opened for each call)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = f"sqlite:///{tmp / 'shop.db'}"
        self.log = tmp / "log.jsonl"
        self.flags = tmp / "flags"
        self.flags.mkdir()
        self.procs = harness.Processes(tmp, Path(__file__).parent / "console_app.py",
                                       "CONSOLE", {"CONSOLE_STORE": self.url,
                                                   "CONSOLE_LOG": str(self.log),
                                                   "CONSOLE_FLAGS": str(self.flags),
                                                   "CONSOLE_MAX_LIFE": "300"})
        self.slots = 0

    def workers(self, n: int) -> None:
        """Exactly ``n`` live workers: start more, or stop the newest ones (gracefully)."""
        started = False
        while len(self.procs.live) < n:
            self.slots += 1
            self.procs.start_worker(f"w{self.slots}")
            started = True
        for slot in sorted(self.procs.live)[n:]:
            self.procs.terminate(slot).wait(timeout=15)
        if started:
            asyncio.run(self.procs.wait_started(self.log, timeout=30))

    def live_instances(self) -> list[str]:
        return [self.procs.instances[slot] for slot in self.procs.live]

    def set_flag(self, name: str) -> None:
        (self.flags / name).touch()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """``await fn(app)`` with an App of the shop's namespace, connected only."""
        import shoal

        async def go() -> Any:
            app = shoal.App("shop", store=self.url)
            async with app.open():
                return await fn(app)
        return asyncio.run(go())

    def log_records(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in harness.read_log(self.log) if r.get("kind") == kind]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.procs.stop_workers(timeout=10)
        self.procs.cleanup()


@contextlib.contextmanager
def contended_lock(url: str, key: str, holder: str, waiter: str) -> Iterator[dict[str, Any]]:
    """Two started Apps of the shop's namespace over the store ``url`` (instances ``holder`` and
    ``waiter``, in a thread with its own event loop): ``holder`` holds the lock ``key`` and
    ``waiter`` waits for it, until the block ends; then the lock passes to ``waiter``, which
    releases it; ``holder`` also charges the meter ``embeddings`` 120 s. Yields ``{"token"}``
    (the holder's fencing token) and, after the block, ``"next_token"`` (the waiter's)."""
    import shoal

    seen: dict[str, Any] = {}
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failed: list[BaseException] = []

    def app(instance: str) -> shoal.App:
        return shoal.App("shop", store=url, instance_id=instance, version="2026.12.1",
                         lease=2.0, membership_interval=0.5)

    async def bounded(check: Callable[[], Any], what: str) -> None:
        deadline = time.monotonic() + 30
        while not await check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def main() -> None:
        a, b = app(holder), app(waiter)
        async with a, b:
            async def slots() -> bool:
                return a.slots(4) is not None and b.slots(4) is not None
            await bounded(slots, "both Apps to own slots")

            async def second() -> None:
                async with b.lock(key) as lock:
                    seen["next_token"] = lock.token

            await a.meter(["embeddings"], [120_000])     # two minutes of debt
            async with a.lock(key) as held:
                seen["token"] = held.token
                queued = asyncio.create_task(second())

                async def waiting() -> bool:
                    view = await a.coordination_view(100)
                    return any(lk.key == key and lk.waiters for lk in view.locks)
                await bounded(waiting, f"{waiter} to wait for {key}")
                ready.set()
                await stop.wait()
            await asyncio.wait_for(queued, 30)

    def run() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as e:
            failed.append(e)
        finally:
            ready.set()
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        ready.wait(60)
        if failed:
            raise failed[0]
        assert "token" in seen, "the lock was not taken within 60 s"
        yield seen
    finally:
        if thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
    if failed:
        raise failed[0]


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    """Three workers over a fresh SQLite store; tests change the count with ``workers(n)``."""
    s = Shop(tmp_path_factory.mktemp("shop"))
    try:
        s.workers(3)
        yield s
    except BaseException:
        print(s.procs.stderr_tail())
        raise
    finally:
        s.close()


@pytest.fixture(scope="module")
def console(shop: Shop) -> Iterator[ConsoleServer]:
    """The console over the shop's store, without a token, read-write."""
    with ConsoleServer(shop.url, namespace="shop") as server:
        yield server
