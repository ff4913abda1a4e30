"""The console as a person uses it: a real headless Chromium on the pages of ``shoal web``'s
ASGI app, over a SQLite store that worker processes serve. Each test acts through the page
(search, click, confirm, type) and then checks the store, not only the page.

Scenarios: the overview's counts move while three workers run; a failed run found by its
idempotency key, its traceback read, retried and succeeded; a refund approved while two
workers run, resolved exactly once; a sleeping run cancelled; a dead letter redriven; the
token (login form) and read-only modes; inputs written to attack the page shown as text.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from browser_support import (
    PHONE,
    ZONE,
    ConsoleServer,
    Shop,
    Shots,
    contended_lock,
    phone,
    wait_for,
    wide,
)

import shoal

pytestmark = pytest.mark.slow

XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = '"><img src=x onerror=alert(1)>'


# -- helpers -----------------------------------------------------------------------------------


def choose(element: Any, value: str) -> None:
    """Pick the option ``value`` of a <select>."""
    from selenium.webdriver.support.select import Select
    Select(element).select_by_value(value)


def css(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By
    return browser.find_element(By.CSS_SELECTOR, selector)


def all_css(browser: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By
    return list(browser.find_elements(By.CSS_SELECTOR, selector))


def confirm(browser: Any, button: Any, **fields: str) -> str:
    """Click an action button, fill the confirmation dialog's ``fields``, confirm, and return
    the message the page shows afterwards (after the reload that follows a success)."""
    button.click()
    dialog = wait_for(lambda: css(browser, "dialog#confirm[open]"), 5, "the confirmation")
    for name, value in fields.items():
        box = css(browser, f"dialog#confirm [name={name}]")
        box.clear()
        box.send_keys(value)
    css(browser, "dialog#confirm button[value=ok]").click()
    wait_for(lambda: gone(dialog), 10, "the dialog to close")
    return wait_for(lambda: css(browser, "#flash:not([hidden])").text, 10, "the outcome")


def gone(element: Any) -> bool:
    """Not shown any more, or not even in the page (the page was loaded again)."""
    from selenium.common.exceptions import StaleElementReferenceException
    try:
        return not element.is_displayed()
    except StaleElementReferenceException:
        return True


def press_enter(element: Any) -> None:
    from selenium.webdriver.common.keys import Keys
    element.send_keys(Keys.ENTER)


def approval(browser: Any, run_id: str) -> Any:
    """The approvals page's section for run ``run_id``'s pause."""
    return wait_for(lambda: [s for s in all_css(browser, "section.approval")
                             if run_id in s.get_attribute("innerHTML")], 10,
                    f"run {run_id}'s approval on the page")[0]


def run_status(shop: Shop, run_id: str) -> str:
    return str(shop.call(lambda app: app.get_run(run_id)).status.value)


def wait_status(shop: Shop, run_id: str, status: str, timeout: float = 30) -> None:
    wait_for(lambda: run_status(shop, run_id) == status, timeout,
             f"run {run_id} to be {status} (it is {run_status(shop, run_id)})")


def dispatch(shop: Shop, workflow: str, input: Any, **options: Any) -> shoal.Run:
    return shop.call(lambda app: app.dispatch(workflow, input, **options))


def no_injection(browser: Any) -> None:
    """No alert is open, no element the attack strings would make exists."""
    from selenium.common.exceptions import NoAlertPresentException
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert browser.execute_script(
        "return document.querySelectorAll('img[src=x], img[onerror]').length") == 0
    scripts = browser.execute_script(
        "return Array.from(document.scripts).map(s => s.src || s.textContent)")
    assert not [s for s in scripts if "alert(1)" in s], scripts


def on_a_phone(browser: Any, shots: Shots, name: str) -> None:
    """The page again at a phone's width: nothing wider than the screen (wide tables scroll in
    their own box), and a full-height screenshot."""
    phone(browser)
    try:
        browser.refresh()
        wait_for(lambda: css(browser, "main"), 10, "the page on a phone")
        width = browser.execute_script("return document.documentElement.scrollWidth")
        assert width <= PHONE[0], f"{name}: the page is {width} px wide on a phone"
        shots.take(browser, name, full=True)
    finally:
        wide(browser)


def js_errors(browser: Any) -> list[str]:
    """Errors of the pages' script since the test began (a refused POST's 409 in the network
    log is an answer, not an error)."""
    return [e["message"] for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and e.get("source") != "network"]


# -- scenarios ---------------------------------------------------------------------------------


def test_overview_counts_move_while_three_workers_run(browser: Any, shop: Shop,
                                                       console: ConsoleServer,
                                                       shots: Shots) -> None:
    shop.workers(3)
    browser.get(console.url + "/")
    before = int(css(browser, '[data-bind="status.succeeded"]').text)
    waiting = int(css(browser, '[data-bind="status.waiting"]').text)
    assert css(browser, "#zone").text == ZONE
    # some work that stays: two refunds waiting for a decision, a charge that fails, a nap
    for amount, customer in ((12.5, "c-3"), (240, "c-9")):
        dispatch(shop, "refund", {"amount": amount, "customer": customer})
    dispatch(shop, "charge", {"card": "4000-0000-0000-9995"})
    dispatch(shop, "nap", {"for": "an hour"})
    shop.call(lambda app: app.dispatch_many("order", [{"n": i} for i in range(40)]))
    # the page is not loaded again: its script polls /api/overview
    wait_for(lambda: int(css(browser, '[data-bind="status.succeeded"]').text) >= before + 40
             and int(css(browser, '[data-bind="status.waiting"]').text) >= waiting + 2,
             60, "the overview to count the new runs")
    assert int(css(browser, '[data-bind="finished_minute"]').text) >= 40
    assert int(css(browser, '[data-bind="chart_total"]').text) >= 40
    assert int(css(browser, '[data-bind="pending_approvals"]').text) >= 2
    assert "warn" in css(browser, "#card-approvals").get_attribute("class")
    listed = css(browser, "#instances").text
    assert all(i in listed for i in shop.procs.instances.values()), listed
    # drawn again by the page's script: each one's version and how long ago it beat
    for row in all_css(browser, "#instances tbody tr"):
        assert "2026.12.1" in row.text and " ago · " in row.text, row.text
    assert "order" in css(browser, "#by-workflow").text
    assert "live · updated" in css(browser, "#live-note").text
    shots.take(browser, "overview", docs=True)
    phone(browser)
    browser.refresh()
    wait_for(lambda: css(browser, "#live"), 5, "the overview")
    assert browser.execute_script("return document.documentElement.scrollWidth") <= PHONE[0]
    shots.take(browser, "overview-phone", docs=True)
    wide(browser)
    assert js_errors(browser) == []


def test_find_a_failed_run_by_idempotency_key_read_its_traceback_and_retry(
        browser: Any, shop: Shop, console: ConsoleServer, shots: Shots) -> None:
    shop.workers(2)
    run = dispatch(shop, "charge", {"card": "4000-0000-0000-0002"},
                   idempotency_key="charge-7001")
    wait_status(shop, run.id, "failed")
    browser.get(console.url + "/runs")
    shots.take(browser, "runs", docs=True)
    on_a_phone(browser, shots, "runs-phone")
    choose(css(browser, "select[name=status]"), "failed")
    css(browser, "#filters button[type=submit]").click()
    # (the URL changes before the new page replaces the old one: wait for what it shows)
    wait_for(lambda: "status=failed" in browser.current_url
             and {e.text for e in all_css(browser, "#runs .status")} == {"failed"}, 10,
             "only failed runs in the list")
    css(browser, "#filters a.button").click()            # Clear
    wait_for(lambda: browser.current_url == console.url + "/runs", 10, "the whole list")
    search = css(browser, "input[name=q]")
    search.send_keys("charge-7001")
    search.submit()
    # the whole list holds the run too: wait for the results page itself, then find the link
    # on it (a link found on the old page goes stale when the new one replaces it)
    wait_for(lambda: "q=charge-7001" in browser.current_url
             and len(all_css(browser, "#runs tbody tr")) == 1, 10, "the search's one result")
    wait_for(lambda: css(browser, f'#runs a[href$="/runs/{run.id}"]'), 10,
             "the run in the results").click()
    traceback = wait_for(lambda: css(browser, "#traceback"), 10, "the traceback")
    assert "Traceback (most recent call last)" in traceback.text
    assert "RuntimeError: card declined: 4000-0000-0000-0002" in traceback.text
    assert css(browser, "#idempotency-key").text == "charge-7001"
    # times in the browser's zone, UTC on hover
    created = css(browser, "dl.fields time[data-ts]")
    at = datetime.fromtimestamp(float(created.get_attribute("data-ts")), ZoneInfo(ZONE))
    assert created.text == at.strftime("%Y-%m-%d %H:%M:%S")
    assert created.get_attribute("title") == at.astimezone(UTC).strftime(
        "%Y-%m-%d %H:%M:%S UTC")
    shots.take(browser, "run-failed", docs=True)
    on_a_phone(browser, shots, "run-failed-phone")
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")          # the page as it is now, to retry again later
    browser.get(f"{console.url}/runs/{run.id}")
    stale = browser.current_window_handle
    browser.switch_to.window(first)
    shop.set_flag(f"charge-ok-{run.id}")
    message = confirm(browser, css(browser, "button[data-act$='/retry']"))
    assert message == "Queued again."
    wait_status(shop, run.id, "succeeded")
    browser.refresh()
    assert css(browser, ".head .status").text == "succeeded"
    assert "A-1001" in css(browser, "#output").text
    assert not all_css(browser, "#traceback")
    assert shop.call(lambda app: app.get_run(run.id)).resume_reason == "retried"
    # a retry from the page drawn before, once the run has succeeded: refused, saying why
    browser.switch_to.window(stale)
    refused = confirm(browser, css(browser, "button[data-act$='/retry']"))
    assert f"Run {run.id} is succeeded now" in refused, refused
    assert css(browser, "#flash").get_attribute("class") == "flash err"
    browser.close()
    browser.switch_to.window(first)


def test_approve_a_refund_while_two_workers_run_resolves_it_once(
        browser: Any, shop: Shop, console: ConsoleServer, shots: Shots) -> None:
    shop.workers(2)
    run = dispatch(shop, "refund", {"amount": 40, "customer": "c-17"},
                   idempotency_key="refund-17")
    wait_status(shop, run.id, "waiting")
    browser.get(console.url + "/approvals")
    on_a_phone(browser, shots, "approvals-phone")
    section = approval(browser, run.id)
    assert '"customer": "c-17"' in section.text
    # a second tab keeps the page as it is now, to answer again once the first has won
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get(console.url + "/approvals")
    stale = browser.current_window_handle
    browser.switch_to.window(first)
    section.find_element("css selector", "button[data-act$='/approve']").click()
    wait_for(lambda: css(browser, "dialog#confirm[open]"), 5, "the confirmation")
    css(browser, "dialog#confirm [name=by]").send_keys("Ana (support)")
    css(browser, "dialog#confirm [name=reason]").send_keys("receipt checked")
    shots.take(browser, "approve-dialog", docs=True)
    press_enter(css(browser, "dialog#confirm [name=reason]"))   # Enter confirms
    message = wait_for(lambda: css(browser, "#flash:not([hidden])").text, 10, "the outcome")
    assert message == "Approved: the run continues."
    wait_status(shop, run.id, "succeeded")
    # the stale tab answers too: refused, saying why, and nothing changes
    browser.switch_to.window(stale)
    refused = confirm(browser, approval(browser, run.id).find_element(
        "css selector", "button[data-act$='/deny']"), by="Bob", reason="too late")
    assert "already resolved" in refused and "Nothing was changed" in refused, refused
    browser.close()
    browser.switch_to.window(first)
    paid = [r for r in shop.log_records("paid") if r["run"] == run.id]
    assert len(paid) == 1, paid
    assert paid[0]["approved"] is True and paid[0]["by"] == "Ana (support)"
    output = shop.call(lambda app: app.get_run(run.id)).output
    assert output == {"approved": True, "by": "Ana (support)", "reason": "receipt checked"}
    assert run.id not in {p.run_id for p in shop.call(lambda app: app.pending_pauses())}
    browser.get(f"{console.url}/runs/{run.id}")
    assert "approved by Ana (support): “receipt checked”" in css(browser, "#pauses").text


def test_cancel_a_sleeping_run(browser: Any, shop: Shop, console: ConsoleServer,
                               shots: Shots) -> None:
    run = dispatch(shop, "nap", {"for": "an hour"}, idempotency_key="nap-1")
    wait_status(shop, run.id, "sleeping")
    browser.get(f"{console.url}/runs/{run.id}")
    assert css(browser, ".head .status").text == "sleeping"
    assert "sleeping until" in css(browser, "#steps").text
    # a signal with a JSON payload: the dialog refuses what is not JSON, before sending
    css(browser, "button[data-act$='/signal']").click()
    wait_for(lambda: css(browser, "dialog#confirm[open]"), 5, "the signal dialog")
    css(browser, "dialog#confirm [name=name]").send_keys("nudge")
    payload = css(browser, "dialog#confirm [name=payload]")
    payload.clear()
    payload.send_keys('{"reason": "check stock"')
    css(browser, "dialog#confirm button[value=ok]").click()
    assert "not valid JSON" in wait_for(lambda: css(browser, ".dialog-error").text, 5,
                                        "the JSON error")
    assert shop.call(lambda app: app.get_run(run.id)).status.value == "sleeping"
    payload.send_keys("}")
    css(browser, "dialog#confirm button[value=ok]").click()
    assert wait_for(lambda: css(browser, "#flash:not([hidden])").text, 10,
                    "the outcome") == "Signal sent."
    assert "nudge" in css(browser, "#signals").text
    assert '{"reason": "check stock"}' in css(browser, "#signals").text
    message = confirm(browser, css(browser, "button[data-act$='/cancel']"))
    assert message == "Cancel requested."
    assert run_status(shop, run.id) == "cancelled"
    assert css(browser, ".head .status").text == "cancelled"
    assert not all_css(browser, "button[data-act$='/cancel']")


def test_a_running_runs_progress_moves_on_its_page_until_it_ends(
        browser: Any, shop: Shop, console: ConsoleServer, shots: Shots) -> None:
    run = dispatch(shop, "index", {"chunks": 4}, idempotency_key="index-1")

    def shown(pct: str) -> bool:
        return bool(css(browser, "#progress .pct").text == pct)

    wait_for(lambda: (run_status(shop, run.id) == "running"
                      and shop.call(lambda app: app.get_run(run.id)).progress), 30,
             "the run to report its progress")
    browser.get(console.url + "/runs?status=running")
    row = wait_for(lambda: [r for r in all_css(browser, "#runs tbody tr")
                            if run.id in r.get_attribute("innerHTML")], 10,
                   "the running run in the list")[0]
    assert "0%" in row.find_element("css selector", ".progress.compact").text
    browser.get(f"{console.url}/runs/{run.id}")
    assert shown("0%") and "chunk 1 of 4" in css(browser, "#progress").text
    browser.execute_script("window.notReloaded = true")
    for i in range(2):
        shop.set_flag(f"index-{run.id}-{i}")
    # redrawn by the page's script from /api/runs/{id}: the page is not loaded again
    wait_for(lambda: shown("50%"), 20, "the progress to reach 50 % on the page")
    assert "chunk 3 of 4" in css(browser, "#progress").text
    assert css(browser, "#progress .pbar").get_attribute("aria-valuenow") == "50"
    assert browser.execute_script("return window.notReloaded === true")
    shots.take(browser, "run-progress")
    for i in range(2, 4):
        shop.set_flag(f"index-{run.id}-{i}")
    wait_status(shop, run.id, "succeeded")
    # the run ended: the page loads again, and shows its last report
    wait_for(lambda: css(browser, ".head .status").text == "succeeded", 20,
             "the page to show the run's end")
    assert shown("100%") and "indexed" in css(browser, "#progress").text
    assert "(its last report)" in css(browser, "#progress").text
    assert not browser.execute_script("return window.notReloaded === true")
    assert js_errors(browser) == []


def test_redrive_a_dead_letter(browser: Any, shop: Shop, console: ConsoleServer,
                               shots: Shots) -> None:
    run = dispatch(shop, "notify", {"event": "paid", "order": 7}, idempotency_key="notify-7")
    wait_for(lambda: [e for e in shop.call(lambda app: app.dead_letters())
                      if e.run_id == run.id], 30, "the webhook to be dead-lettered")
    browser.get(console.url + "/dead-letters")
    on_a_phone(browser, shots, "dead-letters-phone")
    row = wait_for(lambda: [r for r in all_css(browser, "#dead-letters tbody tr")
                            if run.id in r.get_attribute("innerHTML")], 10,
                   "the dead letter on the page")[0]
    assert "503 Service Unavailable" in row.get_attribute("innerHTML")
    shots.take(browser, "dead-letters", docs=True)
    shop.set_flag("webhook-ok")
    message = confirm(browser, row.find_element("css selector", "button[data-act]"))
    assert message == "Redriven: it will be delivered again."
    wait_for(lambda: [r for r in shop.log_records("webhook")
                      if r["key"].startswith(run.id)], 30, "the redriven delivery")
    assert not [e for e in shop.call(lambda app: app.dead_letters()) if e.run_id == run.id]
    browser.refresh()
    assert run.id not in css(browser, "#dead-letters").get_attribute("innerHTML")


def test_a_run_tree_its_spend_and_the_replicas(browser: Any, shop: Shop,
                                               console: ConsoleServer, shots: Shots) -> None:
    root = dispatch(shop, "batch", {"batch": "b-1"}, idempotency_key="batch-1")
    wait_status(shop, root.id, "succeeded")
    children = [r for r in shop.call(lambda app: app.list_runs(workflow="order", limit=500))
                if r.parent_id == root.id]
    assert len(children) == 3
    child = children[0]
    browser.get(f"{console.url}/runs/{child.id}")
    tree = css(browser, "#tree")
    assert len(tree.find_elements("css selector", "li")) == 4
    assert css(browser, f'#parent a[href$="/runs/{root.id}"]')
    assert "0.02 usd" in css(browser, "#spend").text
    assert [e.text for e in all_css(browser, "#steps .name")] == [
        "1. reserve", "2. charge", "3. ship"]
    shots.take(browser, "run-detail", docs=True)
    on_a_phone(browser, shots, "run-detail-phone")
    css(browser, f'#parent a[href$="/runs/{root.id}"]').click()
    wait_for(lambda: css(browser, "#run-id").text == root.id, 10, "the parent's page")
    browser.get(console.url + "/replicas")
    listed = css(browser, "#instances").text
    assert all(i in listed for i in shop.live_instances()), listed
    assert "mount the console in your service" in css(browser, "main").text


def test_replicas_show_a_lock_held_by_one_instance_another_waiting_and_the_slots(
        browser: Any, shop: Shop, console: ConsoleServer, shots: Shots) -> None:
    shop.workers(2)
    workers = shop.live_instances()
    with contended_lock(shop.url, "ledger", "settler-a", "settler-b") as lock:
        browser.get(console.url + "/replicas")

        def roster() -> dict[str, str]:
            browser.refresh()
            return {row.find_element("css selector", "td:nth-child(2)").text:
                    row.find_element("css selector", ".status").text
                    for row in all_css(browser, "#slots tbody tr")}
        expected = {*workers, "settler-a", "settler-b"}
        # a new member joins the roster within a heartbeat or two of each member
        wait_for(lambda: (set(roster()) == expected
                          and set(roster().values()) == {"owns"}), 30,
                 f"a roster of {sorted(expected)}, each owning its slots")
        [row] = [r for r in all_css(browser, "#locks tbody tr") if "ledger" in r.text]
        cells = row.find_elements("css selector", "td")
        assert cells[0].text == "ledger" and cells[1].text == "settler-a"
        assert cells[2].text == str(lock["token"])                  # the fencing token
        assert cells[3].text.startswith("in ")                     # the lease's end
        waiters = [li.text for li in cells[4].find_elements("css selector", "li")]
        assert len(waiters) == 1 and waiters[0].startswith("settler-b ticket"), waiters
        instances = {r.find_element("css selector", "td").text: r.text
                     for r in all_css(browser, "#instances tbody tr")}
        assert expected <= set(instances), instances
        assert "live 2026.12.1" in instances["settler-a"]
        assert all("live 2026.12.1" in instances[w] for w in workers), instances
        assert css(browser, "#meters").text.count("embeddings") == 1
        assert " ago" in instances["settler-a"]
        slots = sorted(roster().keys())
        indexes = sorted(r.find_element("css selector", "td").text
                         for r in all_css(browser, "#slots tbody tr"))
        assert indexes == [f"{i} of {len(slots)}" for i in range(len(slots))]
        shots.take(browser, "replicas-coordination", docs=True, full=True)
        on_a_phone(browser, shots, "replicas-coordination-phone")
    assert lock["next_token"] == lock["token"] + 1
    browser.refresh()
    assert "ledger" not in css(browser, "#locks").text
    assert js_errors(browser) == []


def service_with_a_console() -> Any:
    """A service that runs its own App (memory store) and mounts the console at /ops: the
    console then shows what lives only in the App's code (providers, budgets, cron)."""
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.routing import Mount

    import shoal.web

    app = shoal.App("assist", store="memory://", instance_id="api-1", version="2026.12.1",
                    membership_interval=0.5)
    gpt = app.provider("gpt", max_concurrent=8, requests_per_minute=600,
                       tokens_per_minute=200_000, price_per_token=0.000002,
                       breaker=shoal.Breaker(failures=2, window=60, cooldown=300))
    app.provider("embed", max_concurrent=32, requests_per_minute=3000,
                 tenant_max_concurrent=4)
    app.budget(per_run=1.0, per_tenant_day=50.0, tenants={"acme": 200.0})

    @app.workflow(name="answer", max_attempts=1)
    async def answer(ctx: shoal.RunContext, input: dict[str, Any]) -> str:
        async def model() -> str:
            async with gpt.call(tokens=1200):
                if input["fail"]:
                    raise ConnectionError("gpt: 502 Bad Gateway")
                return "Your order ships on Monday."
        return await ctx.step("model", model)

    @app.cron("*/5 * * * *", name="digest")
    @app.workflow(name="digest")
    async def digest(ctx: shoal.RunContext, input: Any) -> None:
        return None

    @asynccontextmanager
    async def lifespan(service: Starlette) -> Any:
        async with app:
            for i, tenant in enumerate(["acme", "acme", "globex"]):
                await app.dispatch(answer, {"fail": False, "i": i}, tenant=tenant)
            for i in range(2):
                await app.dispatch(answer, {"fail": True, "i": i})
            yield

    return Starlette(lifespan=lifespan, routes=[Mount("/ops", shoal.web.asgi(app))])


def test_mounted_in_a_service_it_shows_providers_budgets_and_cron(browser: Any,
                                                                   shots: Shots) -> None:
    with ConsoleServer(asgi_app=service_with_a_console()) as server:
        browser.get(server.url + "/ops/")
        # two failed calls open the breaker: the overview shows the open circuit (polled)
        wait_for(lambda: "gpt" in css(browser, "#circuits").text, 30, "the open circuit")
        wait_for(lambda: css(browser, '[data-bind="status.failed"]').text == "2", 30,
                 "the two failed runs")
        assert css(browser, "nav a.on").get_attribute("href") == server.url + "/ops/"
        css(browser, 'nav a[href="/ops/replicas"]').click()
        wait_for(lambda: css(browser, "#providers"), 10, "the replicas page")
        providers = css(browser, "#providers").text
        assert "gpt" in providers and "embed" in providers and "open" in providers
        assert "200,000" in providers
        # the state every replica's calls left: window use against the limits, the breaker
        gpt = next(r for r in all_css(browser, "#providers tbody tr")
                   if r.text.startswith("gpt"))
        assert "/ 600" in gpt.text and "/ 200,000" in gpt.text, gpt.text
        assert gpt.find_element("css selector", ".status.s-open").text == "open"
        assert "2 of 2 failures in 1 min" in gpt.text, gpt.text
        budgets = css(browser, "#budgets").text
        assert "acme" in budgets and "globex" in budgets and "200" in budgets
        assert "digest" in css(browser, "#cron").text
        # alone on the roster once it joined (two membership intervals after its start)
        def alone_on_the_roster() -> bool:
            browser.refresh()
            listed = css(browser, "#instances").text
            return "api-1 live 2026.12.1" in listed and "0 of 1" in listed
        wait_for(alone_on_the_roster, 30, "api-1 live, owning every slot")
        assert css(browser, "#slots .status").text == "owns"
        shots.take(browser, "replicas", docs=True, full=True)
        on_a_phone(browser, shots, "replicas-phone")
        links = [a.get_attribute("href") for a in all_css(browser, "nav a, a.card, #cron a")]
        assert links and all(href.startswith(server.url + "/ops/") for href in links), links


def test_token_mode_needs_the_login_form_and_refuses_a_wrong_token(
        browser: Any, shop: Shop, shots: Shots) -> None:
    with ConsoleServer(shop.url, namespace="shop", token="s3cret-token") as server:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(server.url + "/api/overview", timeout=10)
        assert refused.value.code == 401
        browser.get(server.url + "/runs")
        assert browser.current_url.startswith(server.url + "/login")
        assert not all_css(browser, "#runs")
        shots.take(browser, "login", docs=True)
        css(browser, "input[name=token]").send_keys("wrong")
        css(browser, "form button[type=submit]").click()
        assert "Wrong token" in wait_for(lambda: css(browser, "[role=alert]").text, 10,
                                         "the refusal")
        assert not all_css(browser, "#runs")
        css(browser, "input[name=token]").send_keys("s3cret-token")
        css(browser, "form button[type=submit]").click()
        wait_for(lambda: css(browser, "#runs"), 10, "the runs page after logging in")
        assert browser.current_url == server.url + "/runs"
        cookie = browser.get_cookie("shoal_session")
        assert cookie is not None and cookie["httpOnly"] and "s3cret" not in cookie["value"]
        css(browser, ".where button[type=submit]").click()   # log out
        wait_for(lambda: "/login" in browser.current_url, 10, "the login form again")
        browser.get(server.url + "/")
        assert "/login" in browser.current_url


def test_read_only_mode_shows_no_action_and_refuses_one(browser: Any, shop: Shop) -> None:
    run = dispatch(shop, "nap", {"for": "read-only"}, idempotency_key="nap-read-only")
    wait_status(shop, run.id, "sleeping")
    with ConsoleServer(shop.url, namespace="shop", read_only=True) as server:
        browser.get(f"{server.url}/runs/{run.id}")
        assert css(browser, "#read-only").text == "read-only"
        assert all_css(browser, "button[data-act]") == []
        assert all_css(browser, "dialog#confirm") == []
        # the API refuses what the page does not offer, even with the CSRF token
        answer = browser.execute_async_script("""
            const done = arguments[arguments.length - 1];
            fetch(arguments[0], {method: "POST", headers: {"X-CSRF-Token":
                  document.querySelector('meta[name="csrf-token"]').content}})
              .then(async r => done([r.status, await r.json()]));
        """, f"{server.url}/api/runs/{run.id}/cancel")
        assert answer[0] == 403 and "read-only" in answer[1]["error"]
        browser.get(server.url + "/approvals")
        assert all_css(browser, "section.approval")
        assert all_css(browser, "button[data-act]") == []
        browser.get(server.url + "/dead-letters")
        assert all_css(browser, "button[data-act]") == []
    assert run_status(shop, run.id) == "sleeping"


def test_inputs_that_attack_the_page_show_as_text(browser: Any, shop: Shop,
                                                  console: ConsoleServer) -> None:
    order = dispatch(shop, "order", {"name": XSS_IMG, "note": XSS_SCRIPT},
                     idempotency_key=XSS_SCRIPT)
    failed = dispatch(shop, "charge", {"card": XSS_IMG}, idempotency_key=XSS_IMG,
                      concurrency_key=XSS_SCRIPT)
    refund = dispatch(shop, "refund", {"amount": 1, "customer": XSS_SCRIPT})
    for run_id, status in ((order.id, "succeeded"), (failed.id, "failed"),
                           (refund.id, "waiting")):
        wait_status(shop, run_id, status)
    shop.call(lambda app: app.signal(order.id, XSS_IMG, {"x": XSS_SCRIPT}))

    browser.get(console.url + "/runs")
    search = css(browser, "input[name=q]")
    search.send_keys(XSS_SCRIPT)
    search.submit()
    wait_for(lambda: css(browser, f'#runs a[href$="/runs/{order.id}"]'), 10, "the search")
    assert css(browser, "input[name=q]").get_attribute("value") == XSS_SCRIPT
    assert XSS_SCRIPT in css(browser, "#runs").text
    no_injection(browser)

    browser.get(f"{console.url}/runs/{order.id}")
    assert XSS_IMG.replace('"', '\\"') in css(browser, "#input").text
    assert css(browser, "#idempotency-key").text == XSS_SCRIPT
    assert XSS_IMG in css(browser, "#signals").text
    no_injection(browser)

    browser.get(f"{console.url}/runs/{failed.id}")
    assert f"card declined: {XSS_IMG}" in css(browser, "#error").text
    assert XSS_IMG in css(browser, "#traceback").text
    no_injection(browser)

    browser.get(console.url + "/approvals")
    assert XSS_SCRIPT in approval(browser, refund.id).text
    no_injection(browser)
    # the confirmation dialog shows the run's words as text too
    approval(browser, refund.id).find_element("css selector",
                                              "button[data-act$='/approve']").click()
    wait_for(lambda: css(browser, "dialog#confirm[open]"), 5, "the confirmation")
    no_injection(browser)
    css(browser, "dialog#confirm button[value=back]").click()
    browser.get(console.url + "/")
    no_injection(browser)
    assert js_errors(browser) == []
