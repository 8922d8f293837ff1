"""The status page in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven
by Selenium, against a lakehouse built through the real tick path (Sail, Delta, dbt, local jobs).

Screenshots of every page go to pytest's temp dir; with HEARTBEAT_SCREENSHOT_DIR set they are
also written there (that is how docs/images/ui-*.png, shown in the README, are made).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from browser import CHROMEDRIVER, CHROMIUM, headless_chromium
from databricks_jobs_server import JobsApiServer
from harness import Harness
from harness import config_row as row

from heartbeat_runner.core.errors import InvalidInputError
from heartbeat_runner.interfaces.ui.actions import ActionPolicy
from heartbeat_runner.interfaces.ui.server import StatusPage, make_server
from heartbeat_runner.jobs.databricks_workspace import WorkspaceGroups
from heartbeat_runner.lakehouse.store import Cond

# In CI (.ci/run installs them) a missing browser is a failure, not a skip.
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER) and not os.environ.get("CI"),
                                reason="needs Debian's chromium and chromium-driver (.ci/run installs them)")

#: the config of the scenario: job -> (hard sources, soft sources)
CONFIG = [
    row("delta_table", "sales.orders", "orders_etl", name="Orders ETL"),
    row("delta_table", "sales.customers", "orders_etl", hard="FALSE", name="Orders ETL"),
    row("delta_table", "sales.orders", "customer_360", name="Customer 360"),
    row("delta_table", "sales.customers", "customer_360", name="Customer 360"),
    row("trigger_file", "finance/close", "finance_close", name="Finance close"),
    row("delta_table", "sales.customers", "marketing_daily", state="PAUSED", name="Marketing daily"),
    row("delta_table", "sales.invoices", "ap_aging", name="AP aging"),  # a table nobody created: every tick fails it
]
#: what finance_close prints before it exits 1: the line an on-call person needs on its page
LEDGER_ERROR = "ERROR: ledger balance mismatch"
#: two sources whose names differ only at the end (the graph must keep the end of a shortened label)
LONG_SOURCES = ("warehouse.gl_postings_daily_eu_west", "warehouse.gl_postings_daily_us_east")
#: 26 more jobs, idle on those sources (they get no data): 30 jobs, as the page was tried with in issue 43
MORE_JOBS = tuple(f"ledger_reconcile_region_{n:02d}" for n in range(26))
CONFIG += [line for n, job in enumerate(MORE_JOBS) for line in (
    row("delta_table", LONG_SOURCES[n % 2], job, name=f"Ledger reconcile {n:02d}"),
    row("delta_table", LONG_SOURCES[(n + 1) % 2], job, hard="FALSE", name=f"Ledger reconcile {n:02d}"))]


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Iterator[Harness]:
    """orders_etl ran and completed, customer_360 waits for customers, finance_close failed (it printed
    LEDGER_ERROR and exited 1; an open JOB_FAILED alert: alerts are on, with no destination), marketing_daily
    is paused, ap_aging cannot be sensed (its table is missing), MORE_JOBS are idle: every phase the page
    colours, reached by real ticks."""
    root = tmp_path_factory.mktemp("ui")
    with Harness(root) as hb:
        policies = root / "run_policies.yml"
        policies.write_text("alerts:\n  default:\n    job: {failed: true}\n")
        hb.app.settings = hb.settings.with_(run_policy_file=policies)
        hb.create_table("sales.orders", "id INT")
        hb.create_table("sales.customers", "id INT")
        for table in LONG_SOURCES:
            hb.create_table(table, "id INT")
        hb.seed(*CONFIG)
        hb.jobs(orders_etl=0, customer_360=0, finance_close=1, marketing_daily=0, ap_aging=0, **dict.fromkeys(MORE_JOBS, 0),
                prints={"finance_close": LEDGER_ERROR})
        hb.tick()  # baseline
        hb.insert("sales.orders", "(1), (2), (3)")
        hb.drop_trigger_file("finance/close", "ready")
        hb.tick()
        hb.wait_for_jobs()
        hb.tick()
        yield hb


@pytest.fixture(scope="module")
def browser() -> Iterator:
    with headless_chromium() as driver:
        yield driver


def serve(hb: Harness, policy: ActionPolicy) -> tuple[str, object]:
    """The page over the harness's open app on a free port; returns its URL and the server."""
    server = make_server(StatusPage(hb.app, policy, refresh_s=60), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


@pytest.fixture
def page(lakehouse) -> Iterator[str]:
    url, server = serve(lakehouse, ActionPolicy(enabled=False))
    yield url
    server.shutdown()


@pytest.fixture
def operator_page(lakehouse) -> Iterator[str]:
    url, server = serve(lakehouse, ActionPolicy(enabled=True, operators=frozenset({"ops@example.com"})))
    yield url
    server.shutdown()


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as answer:
        return json.loads(answer.read())


def wait_for(driver, css: str, timeout: float = 20):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def wait_until(driver, condition, timeout: float = 20):
    """Wait for ``condition``; an element the page re-rendered while it was being read is looked up again
    (the page redraws its view on each refresh)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, ignored_exceptions=[StaleElementReferenceException]).until(condition)


def screenshot(driver, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))
    target = os.environ.get("HEARTBEAT_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(target) / f"{name}.png"))


def texts(driver, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]


# -- overview -> job page ---------------------------------------------------------------------

def test_overview_lists_every_job_with_its_phase_and_clicks_through_to_the_verdict(page, browser, lakehouse,
                                                                                 tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/")
    wait_for(browser, "#jobs tr[data-job='orders_etl']")
    phases = {r.get_attribute("data-job"): r.find_element(By.CSS_SELECTOR, ".badge").text
              for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")}
    assert phases == {"orders_etl": "IDLE", "customer_360": "WAITING", "finance_close": "FAILED",
                      "marketing_daily": "PAUSED", "ap_aging": "SENSING_ERROR", **dict.fromkeys(MORE_JOBS, "IDLE")}
    assert browser.title == "(1 failed, 1 sensing error) Heartbeat"  # the tab says what needs someone
    orders = browser.find_element(By.CSS_SELECTOR, "#jobs tr[data-job='orders_etl']").text
    assert "COMPLETED" in orders and "version" in orders  # last run and the window it consumed
    screenshot(browser, tmp_path, "ui-overview")

    search = browser.find_element(By.ID, "search")
    search.send_keys("finance")
    wait_until(browser, lambda d: d.find_element(By.ID, "shown").text == "1 shown")
    assert [r.get_attribute("data-job") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tr[data-job]")] \
        == ["finance_close"]
    browser.find_element(By.CSS_SELECTOR, "#jobs tr[data-job='finance_close'] a.job-link").click()

    verdict = wait_for(browser, "#verdict").text
    expected = lakehouse.app.store.read("jobs_trigger_explanation", Cond("trigger_job_id", "finance_close"),
                                        Cond("is_active", True))[0]["verdict"]
    assert verdict == expected and verdict.startswith("blocked by failure")
    runs = texts(browser, "#runs tbody tr")
    assert len(runs) == 1 and "FAILED" in runs[0] and "ERROR: ledger balance mismatch" in runs[0]
    assert any("TRIGGERED" in e for e in texts(browser, "#events tbody tr"))
    browser.execute_script("state.filter.q = ''")  # the next test starts unfiltered


def test_the_page_styles_every_phase_the_server_names(page):
    """The page takes its phases from the server (JobPhase); each has a colour in the style sheet."""
    from heartbeat_runner.interfaces.ui.data import JobPhase

    with urllib.request.urlopen(page + "/api/meta") as answer:
        assert json.loads(answer.read())["phases"] == [p.value for p in JobPhase]
    with urllib.request.urlopen(page + "/static/app.css") as answer:
        css = answer.read().decode()
    assert all(f".badge.{p.value}" in css for p in JobPhase)


def test_the_graph_colours_every_phase_and_source_health_the_server_names(page):
    """The graph fills a job node by its phase and a source node by its health from the script's COLORS:
    every JobPhase and SourceHealth has one (SENSING_ERROR jobs were drawn without a fill)."""
    import re

    from heartbeat_runner.interfaces.ui.data import JobPhase, SourceHealth

    with urllib.request.urlopen(page + "/static/app.js") as answer:
        script = answer.read().decode()
    colours = re.search(r"const COLORS = \{(.*?)\};", script, re.S)
    assert colours is not None
    named = set(re.findall(r"(\w+): \"#[0-9a-f]{6}\"", colours.group(1)))
    assert {p.value for p in JobPhase} | {h.value for h in SourceHealth} <= named
    order = re.search(r"const HEALTH_ORDER = \[(.*?)\];", script)
    assert order is not None and re.findall(r'"(\w+)"', order.group(1)) == [h.value for h in SourceHealth]


def test_run_output_link_serves_the_jobs_output(page, lakehouse):
    run = lakehouse.app.store.read("heartbeat_job_runs", Cond("trigger_job_id", "orders_etl"))[0]
    with urllib.request.urlopen(f"{page}/api/jobs/orders_etl/runs/{run['job_run_id']}/output") as answer:
        assert answer.status == 200 and answer.headers["Content-Type"].startswith("text/plain")


# -- graph ------------------------------------------------------------------------------------

def test_graph_nodes_and_edges_match_the_config(page, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/graph")
    wait_for(browser, "#graph .node")
    nodes = {n.get_attribute("data-id") for n in browser.find_elements(By.CSS_SELECTOR, "#graph .node")}
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to"), e.get_attribute("class").split()[-1])
             for e in browser.find_elements(By.CSS_SELECTOR, "#graph .edge")}
    expected_edges = set()
    for line in CONFIG:
        cells = line.split(",")
        expected_edges.add((f"source:{cells[0]}:{cells[1]}", f"job:{cells[6]}",
                            "hard" if cells[9] == "TRUE" else "soft"))
    assert edges == expected_edges
    # each source once, however many jobs read it
    assert nodes == {e[0] for e in expected_edges} | {e[1] for e in expected_edges}
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .node.source")) == len({e[0] for e in expected_edges})
    assert browser.find_element(By.CSS_SELECTOR, "#graph .node[data-id='job:finance_close']") \
        .get_attribute("data-status") == "FAILED"
    screenshot(browser, tmp_path, "ui-graph")

    browser.find_element(By.ID, "search").send_keys("finance")
    wait_for(browser, "#graph[data-nodes='2']")
    assert {n.get_attribute("data-id") for n in browser.find_elements(By.CSS_SELECTOR, "#graph .node")} \
        == {"job:finance_close", "source:trigger_file:finance/close"}


# -- ticks ------------------------------------------------------------------------------------

def test_ticks_chart_stage_durations_and_fold_a_source_failing_every_tick(page, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/ticks")
    wait_for(browser, "#stage-chart rect.stage")
    stages = {r.get_attribute("data-stage") for r in browser.find_elements(By.CSS_SELECTOR, "#stage-chart rect.stage")}
    assert {"sensing", "dbt", "triggering"} <= stages
    ticks = get_json(page + "/api/ticks")["runs"]
    assert len(ticks) >= 3 and texts(browser, "#ticks tbody tr")
    problems = texts(browser, "#problems tbody tr")
    assert any("SKIPPED" in p for p in problems)
    # the missing table fails every tick the same way: one row, "x N since" its first tick, not one per tick
    missing = [p for p in problems if "sales.invoices" in p]
    assert len(missing) == 1 and f"× {len(ticks)} since {ticks[-1]['snapshot_ts'][:10]}" in missing[0], missing
    screenshot(browser, tmp_path, "ui-ticks")


# -- actions ----------------------------------------------------------------------------------

def test_open_alerts_show_on_the_overview_and_on_the_job_they_name(page, browser, lakehouse):
    """finance_close's failed run raised JOB_FAILED (recorded in the lakehouse; no destination is set):
    the overview lists it with what it says, its job page too, another job's page not."""
    alerts = get_json(page + "/api/alerts")["alerts"]
    assert [(a["kind"], a["jobs"]) for a in alerts] == [("JOB_FAILED", ["finance_close"])]
    assert alerts[0]["alert_key"] in {r["alert_key"] for r in lakehouse.app.store.read("heartbeat_alerts")}
    browser.get(page + "/#/")
    panel = wait_for(browser, "#open-alerts")
    assert "1 open alert" in panel.text and "JOB_FAILED" in panel.text and "ledger balance mismatch" in panel.text
    assert "the lakehouse only" in panel.text  # no destination configured
    browser.get(page + "/#/jobs/finance_close")
    assert "JOB_FAILED" in wait_for(browser, "#job-alerts").text
    browser.get(page + "/#/jobs/orders_etl")
    wait_until(browser, lambda b: "orders_etl" in b.find_element("css selector", "#view h2").text)
    assert browser.find_elements("css selector", "#job-alerts") == []


def test_actions_are_absent_without_the_flag_and_refused_by_the_api(page, browser):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/jobs/orders_etl")
    wait_for(browser, "#verdict")
    assert browser.find_elements(By.CSS_SELECTOR, "#actions, [data-action]") == []
    request = urllib.request.Request(f"{page}/api/actions/pause", method="POST",
                                     data=json.dumps({"job_id": "orders_etl"}).encode(),
                                     headers={"Content-Type": "application/json", "X-Heartbeat-Action": "confirm"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403 and "--allow-actions" in json.loads(refused.value.read())["error"]


def test_an_operator_pauses_a_job_after_confirming_and_it_is_audited(operator_page, browser, lakehouse, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(operator_page + "/#/jobs/customer_360")
    wait_for(browser, "#actions [data-action='pause']").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Pause job customer_360?" in dialog.text
    dialog.find_element(By.NAME, "reason").send_keys("upstream is reloading")
    screenshot(browser, tmp_path, "ui-confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    assert "paused by" in wait_for(browser, "#action-result .notice", timeout=90).text
    wait_for(browser, "#actions [data-action='resume']")  # the page re-read the job: it is paused now

    paused = lakehouse.events("JOB_PAUSED")
    assert [e["trigger_job_id"] for e in paused] == ["customer_360"]
    audit = json.loads(paused[0]["payload"])
    assert audit["via"] == "ui" and "@" in audit["by"] and audit["reason"] == "upstream is reloading"
    assert {r["job_state"] for r in lakehouse.rows("customer_360")} == {"PAUSED"}


def test_behind_the_app_proxy_only_named_operators_may_act(operator_page, lakehouse):
    def pause(user: str) -> int:
        request = urllib.request.Request(
            f"{operator_page}/api/actions/resume", method="POST", data=json.dumps({"job_id": "marketing_daily"}).encode(),
            headers={"Content-Type": "application/json", "X-Heartbeat-Action": "confirm", "X-Forwarded-Email": user})
        try:
            with urllib.request.urlopen(request) as answer:
                return answer.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert pause("analyst@example.com") == 403
    assert lakehouse.events("JOB_RESUMED") == []
    assert pause("ops@example.com") == 200
    resumed = lakehouse.events("JOB_RESUMED")
    assert [json.loads(e["payload"])["by"] for e in resumed] == ["ops@example.com"]


def test_the_api_answers_by_the_kind_of_error_not_its_text(operator_page):
    """404 for a job that does not exist, 400 for a body that is no JSON: decided by the error's class."""
    def answer(path: str, body: bytes | None = None) -> tuple[int, str]:
        headers = {"Content-Type": "application/json", "X-Heartbeat-Action": "confirm",
                   "X-Forwarded-Email": "ops@example.com"}
        request = urllib.request.Request(operator_page + path, data=body, headers=headers,
                                         method="POST" if body is not None else "GET")
        try:
            with urllib.request.urlopen(request) as found:
                return found.status, ""
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())["error"]

    assert answer("/api/jobs/NOPE") == (404, "job 'NOPE' is not in the control table")
    assert answer("/api/actions/pause", json.dumps({"job_id": "NOPE"}).encode())[0] == 404
    status, error = answer("/api/actions/pause", b"{not json")
    assert status == 400 and error.startswith("request body is not JSON")


def test_an_operator_retries_a_failed_job_from_its_page_and_the_next_tick_reruns_it(operator_page, browser,
                                                                                    lakehouse):
    """Retry is offered on a FAILED job only; confirmed, it is audited (via ui, with the reason) and the next
    tick re-runs the job once over the same data with a new token."""
    from selenium.webdriver.common.by import By

    browser.get(operator_page + "/#/jobs/orders_etl")
    wait_for(browser, "#actions [data-action='complete']")
    assert browser.find_elements(By.CSS_SELECTOR, "#actions [data-action='retry']") == []  # it did not fail
    browser.get(operator_page + "/#/jobs/finance_close")
    wait_for(browser, "#actions [data-action='retry']").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Retry job finance_close?" in dialog.text
    dialog.find_element(By.NAME, "reason").send_keys("ledger fixed")
    browser.find_element(By.ID, "confirm-ok").click()
    assert "retry asked by" in wait_for(browser, "#action-result .notice", timeout=90).text
    wait_until(browser, lambda b: "the next tick re-runs it" in b.find_element(By.ID, "verdict").text)
    events = texts(browser, "#events tbody tr")
    asked = [e for e in events if "RETRY_ASKED" in e]
    assert asked and "operator" in asked[0] and not any("retry_asked" in e for e in events)  # a word, not a run id

    (ask,) = lakehouse.events("RETRY_ASKED")
    audit = json.loads(ask["payload"])
    assert ask["trigger_job_id"] == "finance_close" and audit["via"] == "ui" and audit["reason"] == "ledger fixed"
    tokens = {e["idempotency_token"] for e in lakehouse.events("TRIGGER_REQUESTED") if e["trigger_job_id"] == "finance_close"}
    lakehouse.tick()
    (retry,) = lakehouse.events("RETRY_REQUESTED")
    assert retry["trigger_job_id"] == "finance_close" and retry["idempotency_token"] not in tokens
    lakehouse.wait_for_jobs()  # it fails again (exit 1): the job is back to FAILED, as it was
    assert lakehouse.job_status("finance_close") == {"FAILED"}


def test_an_operator_runs_a_job_now_from_its_page_once(operator_page, browser, lakehouse):
    """Run now: confirmed, audited (via ui), shown in the verdict until the next tick requests the run; the run
    is labelled manual (who asked, why) on the job page and in the overview's last run."""
    from selenium.webdriver.common.by import By

    browser.get(operator_page + "/#/jobs/orders_etl")
    wait_for(browser, "#actions [data-action='trigger']").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Trigger job orders_etl?" in dialog.text
    dialog.find_element(By.NAME, "reason").send_keys("month-end rerun")
    browser.find_element(By.ID, "confirm-ok").click()
    assert "manual run asked by" in wait_for(browser, "#action-result .notice", timeout=90).text
    wait_until(browser, lambda b: "the next tick requests it" in b.find_element(By.ID, "verdict").text)
    (ask,) = lakehouse.events("TRIGGER_ASKED")
    assert ask["trigger_job_id"] == "orders_etl" and json.loads(ask["payload"])["via"] == "ui"

    before = len(lakehouse.events("TRIGGER_REQUESTED"))
    lakehouse.tick()
    lakehouse.tick()
    requests = lakehouse.events("TRIGGER_REQUESTED")
    assert len(requests) == before + 1 and requests[-1]["trigger_job_id"] == "orders_etl"
    assert requests[-1]["message"].startswith("manual run asked by")
    lakehouse.wait_for_jobs()
    assert lakehouse.job_status("orders_etl") == {"COMPLETED"}
    browser.execute_script("refresh()")
    wait_until(browser, lambda b: b.find_element(By.ID, "action-result").text == "")  # the run ended: notice gone
    newest = texts(browser, "#runs tbody tr")[0]
    assert "COMPLETED" in newest and "manual" in newest and "month-end rerun" in newest  # labelled, with its reason
    browser.get(operator_page + "/#/")                                # the overview's last run: labelled too
    tag = wait_for(browser, "tr[data-job='orders_etl'] .c-run .tag")
    assert tag.text == "manual" and "month-end rerun" in (tag.get_attribute("title") or "")


# -- the on-call view (issue 43) ----------------------------------------------------------------

@pytest.fixture
def live_page(lakehouse) -> Iterator[str]:
    """The page refreshing every second (the served default is 5 s), to watch refreshes happen."""
    server = make_server(StatusPage(lakehouse.app, ActionPolicy(enabled=False), refresh_s=1), "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@contextlib.contextmanager
def viewport(driver, width: int, height: int = 900) -> Iterator[None]:
    """The page laid out at ``width`` CSS pixels (Chromium's device metrics), back to the window after."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
    try:
        yield
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


#: for each of the first five jobs of the overview: its verdict as shown (a visible element inside the
#: screen's width holding it) or null
VISIBLE_VERDICTS = """
return [...document.querySelectorAll('#jobs tbody.job')].slice(0, 5).map((job) => {
  const shown = [...job.querySelectorAll('.verdict')].find((el) => {
    const box = el.getBoundingClientRect();
    return el.offsetParent !== null && box.width > 0 && box.left >= 0 && box.right <= innerWidth + 0.5;
  });
  return [job.querySelector('tr[data-job]').dataset.job, shown ? shown.textContent.trim() : null];
});
"""

#: pairs of header items (brand, page links, runner, meta) whose boxes overlap
HEADER_OVERLAPS = """
const boxes = [...document.querySelectorAll('.top .brand, .top nav a, #runner, #meta')]
  .filter((el) => el.textContent.trim()).map((el) => [el.textContent.trim(), el.getBoundingClientRect()]);
const overlaps = [];
boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {
  if (p.left < q.right - 0.5 && q.left < p.right - 0.5 && p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5) overlaps.push([a, b]);
}));
return overlaps;
"""


@pytest.mark.parametrize("width", [1024, 400])
def test_the_overview_fits_the_screen_and_shows_each_jobs_verdict(page, browser, lakehouse, tmp_path, width):
    """No horizontal scroll at 1,024 px nor on a 400 px phone; the verdict of each of the first five jobs
    is on screen (a column, or the line under its row), with why a failed run failed; the header's links
    wrap without overlapping."""
    verdicts = {r["trigger_job_id"]: r["verdict"] for r in lakehouse.app.store.read(
        "jobs_trigger_explanation", Cond("is_active", True))}
    with viewport(browser, width):
        browser.get(page + "/#/")
        wait_for(browser, "#jobs tbody.job")
        assert browser.execute_script("return innerWidth") == width
        assert browser.execute_script("return document.documentElement.scrollWidth") <= width
        shown = browser.execute_script(VISIBLE_VERDICTS)
        assert len(shown) == 5
        for job, text in shown:
            assert text is not None and text.startswith(verdicts[job]), (job, text)
        failed = dict(shown)["finance_close"]  # needs attention: first
        assert "ledger balance mismatch" in failed  # why its last run failed, under the verdict
        assert browser.execute_script(HEADER_OVERLAPS) == []
        screenshot(browser, tmp_path, f"ui-overview-{width}")
        for path, drawn in (("#/graph", "#graph .node"), ("#/ticks", "#ticks tbody tr"),
                            ("#/jobs/finance_close", "#runs tbody tr")):  # the other pages fit too
            browser.get(f"{page}/{path}")
            wait_for(browser, drawn)
            assert browser.execute_script("return document.documentElement.scrollWidth") <= width, path


def test_a_refresh_keeps_focus_typed_text_and_unchanged_rows(live_page, browser):
    """The page refreshes in place: the search box keeps focus and what was typed, a row that did not
    change is the same element (so a selection in it stays), and the live region is polite."""
    from selenium.webdriver.common.by import By

    browser.get(live_page + "/#/")
    wait_for(browser, "#jobs tr[data-job='orders_etl']")
    search = browser.find_element(By.ID, "search")
    search.click()
    search.send_keys("ledger_reconcile_region_0")
    wait_until(browser, lambda d: d.find_element(By.ID, "shown").text == "10 shown")
    browser.execute_script("""
      const row = document.querySelector("#jobs tr[data-job='ledger_reconcile_region_03']");
      row.dataset.marked = "kept";
      getSelection().selectAllChildren(row.querySelector('.c-job'));""")
    updated = browser.find_element(By.ID, "meta").text
    for _ in range(2):  # two refreshes of the page
        wait_until(browser, lambda d, before=updated: d.find_element(By.ID, "meta").text != before)
        updated = browser.find_element(By.ID, "meta").text
    assert browser.execute_script("return document.activeElement.id") == "search"
    assert browser.find_element(By.ID, "search").get_attribute("value") == "ledger_reconcile_region_0"
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs tr[data-marked='kept']")  # not redrawn
    assert "ledger_reconcile_region_03" in browser.execute_script("return getSelection().toString()")
    live = browser.find_element(By.ID, "live")
    assert live.get_attribute("aria-live") == "polite" and browser.find_element(By.ID, "view").get_attribute("aria-live") is None
    assert "q=ledger_reconcile_region_0" in browser.current_url  # the search is in the address


def test_filters_search_sort_and_page_come_from_the_address_and_back_restores_them(page, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(page + "/#/?q=ledger&phase=IDLE&sort=job")
    wait_until(browser, lambda d: d.find_element(By.ID, "shown").text == f"{len(MORE_JOBS)} shown")
    assert browser.find_element(By.ID, "search").get_attribute("value") == "ledger"
    assert Select(browser.find_element(By.ID, "phase")).first_selected_option.text == "IDLE"
    assert browser.find_element(By.ID, "sort").get_attribute("value") == "job"
    jobs = [r.get_attribute("data-job") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tr[data-job]")]
    assert jobs == sorted(MORE_JOBS)

    Select(browser.find_element(By.ID, "phase")).select_by_visible_text("FAILED")
    wait_until(browser, lambda d: d.find_element(By.ID, "shown").text == "0 shown")
    assert "phase=FAILED" in browser.current_url
    browser.back()
    wait_until(browser, lambda d: d.find_element(By.ID, "shown").text == f"{len(MORE_JOBS)} shown")
    assert Select(browser.find_element(By.ID, "phase")).first_selected_option.text == "IDLE"

    browser.get(page + "/#/graph?q=finance")
    wait_for(browser, "#graph[data-nodes='2']")
    assert browser.find_element(By.ID, "search").get_attribute("value") == "finance"


def test_the_failed_runs_reason_and_output_are_on_the_job_page(page, browser, tmp_path):
    """finance_close printed LEDGER_ERROR and exited 1: its page says so at the top (the reason and the
    end of the output), and a run's whole output opens on the page, not as a raw file."""
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/jobs/finance_close")
    wait_for(browser, "#failure-box")
    wait_until(browser, lambda d: LEDGER_ERROR in d.find_element(By.ID, "failure-tail").text)
    assert "ledger balance mismatch" in browser.find_element(By.ID, "failure-reason").text
    assert browser.find_element(By.ID, "failure-tail").is_displayed()
    screenshot(browser, tmp_path, "ui-job")
    browser.find_element(By.CSS_SELECTOR, "#runs [data-output]").click()
    output = wait_for(browser, "#run-output")
    wait_until(browser, lambda d: LEDGER_ERROR in d.find_element(By.ID, "run-output").text)
    assert output.tag_name == "pre"
    times = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#runs time")]
    assert times and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", t) for t in times)
    with viewport(browser, 400, 860):
        browser.execute_script("window.scrollTo(0, 0)")
        assert browser.execute_script("return document.documentElement.scrollWidth") <= 400
        screenshot(browser, tmp_path, "ui-job-400")


def test_times_are_shown_in_the_zone_the_server_names(page, browser):
    """With /api/meta's timezone (the deployment's), each time reads in that zone, named."""
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/jobs/orders_etl")
    wait_for(browser, "#runs time")
    browser.execute_script("state.meta.timezone = 'Asia/Tokyo'; document.getElementById('view').dataset.page = ''; refresh()")
    wait_until(browser, lambda d: all(t.text.endswith(" Asia/Tokyo") for t in d.find_elements(By.CSS_SELECTOR, "#runs time")))
    first = browser.find_element(By.CSS_SELECTOR, "#runs time")
    at = datetime.fromisoformat(first.get_attribute("datetime"))
    at = at if at.tzinfo else at.replace(tzinfo=timezone.utc)
    shown, expected = first.text, at.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M:%S Asia/Tokyo")
    assert shown == expected


def test_graph_fit_shows_every_node_and_long_labels_keep_their_end(page, browser):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/graph")
    wait_for(browser, "#graph .node")
    for _ in range(4):
        browser.find_element(By.ID, "zoom-in").click()
    inside = """const frame = document.getElementById('graph').getBoundingClientRect();
      return [...document.querySelectorAll('#graph .node')].filter((n) => { const b = n.getBoundingClientRect();
        return b.left >= frame.left - 1 && b.right <= frame.right + 1 && b.top >= frame.top - 1 && b.bottom <= frame.bottom + 1; }).length;"""
    nodes = len(browser.find_elements(By.CSS_SELECTOR, "#graph .node"))
    assert browser.execute_script(inside) < nodes  # zoomed in: some are out of view
    browser.find_element(By.ID, "zoom-fit").click()
    assert browser.execute_script(inside) == nodes
    labels = {n.find_element(By.CSS_SELECTOR, "title").get_attribute("textContent"): n.find_element(By.TAG_NAME, "text").text
              for n in browser.find_elements(By.CSS_SELECTOR, "#graph .node.source")
              if "gl_postings" in n.get_attribute("data-id")}
    assert len(labels) == 2 and len(set(labels.values())) == 2  # told apart
    for full, shown in labels.items():
        assert full.startswith("delta_table:warehouse.gl_postings_daily_") and "…" in shown
        assert shown.endswith(full[-12:])  # the distinguishing end is kept


def test_the_page_has_an_icon(page, browser):
    with urllib.request.urlopen(page + "/favicon.ico") as answer:
        assert answer.status == 200 and answer.headers["Content-Type"] == "image/svg+xml"
        assert answer.read().startswith(b"<svg")
    browser.get(page + "/")
    icon = wait_for(browser, "link[rel=icon]")
    assert icon.get_attribute("href").endswith("/favicon.svg")


def test_consecutive_ticks_failing_the_same_way_are_one_row():
    """One missing table fails sensing at every tick: one row "x N since", not one per tick; a tick
    in between without the error, or another error, starts a new row; an OK tick is never folded."""
    from heartbeat_runner.interfaces.ui.data import fold_failing_ticks, fold_problems

    t = [datetime(2026, 11, 27, 21, 0, s, tzinfo=timezone.utc) for s in range(6)]  # t[5] newest
    ids = ["r5", "r4", "r3", "r2", "r1", "r0"]  # newest first

    def problem(run: str, error: str) -> dict:
        return {"run_id": run, "snapshot_ts": t[int(run[1])], "source_key": "delta_table:gone", "outcome": "ERROR",
                "error": error, "trigger_job_ids": "a"}

    problems = [problem("r5", "table gone"), problem("r4", "table gone"), problem("r3", "table gone"),
                problem("r1", "table gone"), problem("r0", "denied")]
    rows = fold_problems(problems, ids)
    assert [(r.latest_run_id, r.ticks, r.since, r.error) for r in rows] == [
        ("r5", 3, t[3], "table gone"), ("r1", 1, t[1], "table gone"), ("r0", 1, t[0], "denied")]

    def tick(run: str, status: str, message: str | None) -> dict:
        return {"run_id": run, "snapshot_ts": t[int(run[1])], "status": status, "message": message}

    ticks = [tick("r5", "ERROR", "1 sensor error"), tick("r4", "ERROR", "1 sensor error"), tick("r3", "OK", None),
             tick("r2", "OK", None), tick("r1", "ERROR", "1 sensor error"), tick("r0", "ERROR", "2 sensor errors")]
    folded = fold_failing_ticks(ticks)
    assert [(r.tick["run_id"], r.repeats, r.since) for r in folded] == [
        ("r5", 2, t[4]), ("r3", 1, t[3]), ("r2", 1, t[2]), ("r1", 1, t[1]), ("r0", 1, t[0])]


# -- the command ------------------------------------------------------------------------------

def test_ui_command_serves_the_page_read_only_and_sees_what_another_process_writes(lakehouse, tmp_path):
    """`python -m heartbeat_runner ui` in its own process (its own engine session) next to the
    runner's: the page, its files, and a change the runner's process makes after the page started."""
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HEARTBEAT_HOME": str(lakehouse.home), "HEARTBEAT_CONFIG": str(lakehouse.config_path),
           "HEARTBEAT_JOBS_FILE": str(lakehouse.jobs_path)}
    server = subprocess.Popen([sys.executable, "-m", "heartbeat_runner", "ui", "--port", str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        first = server.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in first and "read-only" in first, first

        def get(path: str) -> bytes:
            with urllib.request.urlopen(base + path, timeout=60) as answer:
                return answer.read()

        assert b'src="/static/app.js"' in get("/")
        assert b"renderOverview" in get("/static/app.js")
        assert json.loads(get("/api/meta"))["actions_enabled"] is False
        jobs = {j["job_id"]: j for j in json.loads(get("/api/overview"))["jobs"]}
        assert set(jobs) == {"orders_etl", "customer_360", "finance_close", "marketing_daily", "ap_aging", *MORE_JOBS}
        before = jobs["orders_etl"]["last_run"]["job_run_id"]

        lakehouse.insert("sales.orders", "(7)")
        lakehouse.tick()  # in the runner's process: orders_etl has new data -> triggered again
        deadline, latest = time.monotonic() + 30, before
        while latest == before and time.monotonic() < deadline:
            time.sleep(1.5)  # past the page's one-second cache
            latest = {j["job_id"]: j for j in json.loads(get("/api/overview"))["jobs"]}["orders_etl"]["last_run"][
                "job_run_id"]
        assert latest != before, "the page does not see the runner's new trigger"
    finally:
        server.terminate()
        server.wait(timeout=30)



# -- the page as a Databricks App: who may act ----------------------------------------------------

def post_action(url: str, action: str, job_id: str, headers: dict[str, str]) -> int:
    """POST one action as the page does (with the confirm header); the HTTP status."""
    request = urllib.request.Request(
        f"{url}/api/actions/{action}", method="POST", data=json.dumps({"job_id": job_id}).encode(),
        headers={"Content-Type": "application/json", "X-Heartbeat-Action": "confirm", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def policy_page(lakehouse) -> Iterator:
    """Serve the page with a given policy; every server is shut down after the test."""
    servers = []

    def start(policy: ActionPolicy) -> str:
        url, server = serve(lakehouse, policy)
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()


def test_as_a_databricks_app_an_action_without_the_signed_in_user_is_refused_and_changes_nothing(policy_page,
                                                                                                lakehouse):
    """Databricks Apps sets DATABRICKS_APP_NAME/PORT; a request that did not come through its sign-in (no
    X-Forwarded-Email) must not act as the user running the page: 403, nothing recorded."""
    app_env = {"DATABRICKS_APP_NAME": "heartbeat-ui", "DATABRICKS_APP_PORT": "8000",
               "HEARTBEAT_UI_OPERATORS": "ops@example.com"}
    url = policy_page(ActionPolicy.from_environment(True, app_env))
    paused_before = lakehouse.events("JOB_PAUSED")
    assert post_action(url, "pause", "orders_etl", {}) == 403
    assert lakehouse.events("JOB_PAUSED") == paused_before
    assert {r["job_state"] for r in lakehouse.rows("orders_etl")} == {"UNPAUSED"}
    assert get_json(url + "/api/meta")["can_act"] is False


def test_operators_are_matched_by_email_never_by_the_forwarded_user_id(policy_page):
    """X-Forwarded-User is the identity provider's user id, not an e-mail: listing it grants nothing; the
    e-mail in X-Forwarded-Email does. (A job that does not exist answers 404 once the operator is let in,
    so nothing changes either way.)"""
    url = policy_page(ActionPolicy(enabled=True, operators=frozenset({"ops@example.com", "svc-ops"})))
    assert post_action(url, "pause", "NOPE", {"X-Forwarded-User": "svc-ops"}) == 403
    assert post_action(url, "pause", "NOPE", {"X-Forwarded-User": "ops@example.com"}) == 403
    assert post_action(url, "pause", "NOPE", {"X-Forwarded-Email": "ops@example.com",
                                              "X-Forwarded-User": "8467312190"}) == 404
    with pytest.raises(InvalidInputError, match="svc-ops is not an e-mail address"):
        ActionPolicy.from_environment(True, {"HEARTBEAT_UI_OPERATORS": "ops@example.com, svc-ops"})


def test_members_of_an_operator_group_may_act_looked_up_in_the_workspace(policy_page):
    """HEARTBEAT_UI_OPERATOR_GROUPS: membership comes from the workspace's SCIM users API (the stand-in)."""
    with JobsApiServer() as workspace:
        workspace.workspace.add_user("lead@example.com", ("heartbeat-operators", "users"))
        workspace.workspace.add_user("analyst@example.com", ("users",))
        env = {"DATABRICKS_APP_NAME": "heartbeat-ui", "HEARTBEAT_UI_OPERATOR_GROUPS": "heartbeat-operators"}
        url = policy_page(ActionPolicy.from_environment(True, env, groups_of=WorkspaceGroups(workspace.client())))
        assert post_action(url, "pause", "NOPE", {"X-Forwarded-Email": "lead@example.com"}) == 404
        assert post_action(url, "pause", "NOPE", {"X-Forwarded-Email": "analyst@example.com"}) == 403
        assert post_action(url, "pause", "NOPE", {"X-Forwarded-Email": "stranger@example.com"}) == 403
