"""The status page in a real browser: headless Chromium (Debian's chromium + chromium-driver) driven
by Selenium, against a lakehouse built through the real tick path (Sail, Delta, dbt, local jobs).

Screenshots of every page go to pytest's temp dir; with HEARTBEAT_SCREENSHOT_DIR set they are
also written there (that is how docs/images/ui-*.png, shown in the README, are made).
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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
]


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory) -> Iterator[Harness]:
    """orders_etl ran and completed, customer_360 waits for customers, finance_close failed (an open
    JOB_FAILED alert: alerts are on, with no destination), marketing_daily is paused: every phase the
    page colours, reached by real ticks."""
    root = tmp_path_factory.mktemp("ui")
    with Harness(root) as hb:
        policies = root / "run_policies.yml"
        policies.write_text("alerts:\n  default:\n    job: {failed: true}\n")
        hb.app.settings = hb.settings.with_(run_policy_file=policies)
        hb.create_table("sales.orders", "id INT")
        hb.create_table("sales.customers", "id INT")
        hb.seed(*CONFIG)
        hb.jobs(orders_etl=0, customer_360=0, finance_close=3, marketing_daily=0)
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
                      "marketing_daily": "PAUSED"}
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
    assert len(runs) == 1 and "FAILED" in runs[0] and "exit code 3" in runs[0]
    assert any("TRIGGERED" in e for e in texts(browser, "#events tbody tr"))
    screenshot(browser, tmp_path, "ui-job")
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
    assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .node.source")) == 3
    assert browser.find_element(By.CSS_SELECTOR, "#graph .node[data-id='job:finance_close']") \
        .get_attribute("data-status") == "FAILED"
    screenshot(browser, tmp_path, "ui-graph")

    browser.find_element(By.ID, "search").send_keys("finance")
    wait_for(browser, "#graph[data-nodes='2']")
    assert {n.get_attribute("data-id") for n in browser.find_elements(By.CSS_SELECTOR, "#graph .node")} \
        == {"job:finance_close", "source:trigger_file:finance/close"}


# -- ticks ------------------------------------------------------------------------------------

def test_ticks_chart_stage_durations_and_list_skipped_sources(page, browser, tmp_path):
    from selenium.webdriver.common.by import By

    browser.get(page + "/#/ticks")
    wait_for(browser, "#stage-chart rect.stage")
    stages = {r.get_attribute("data-stage") for r in browser.find_elements(By.CSS_SELECTOR, "#stage-chart rect.stage")}
    assert {"sensing", "dbt", "triggering"} <= stages
    assert len(texts(browser, "#ticks tbody tr")) >= 3
    assert any("SKIPPED" in p for p in texts(browser, "#problems tbody tr"))
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
    assert "1 open alert" in panel.text and "JOB_FAILED" in panel.text and "exit code 3" in panel.text
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
    screenshot(browser, tmp_path, "ui-confirm")
    browser.find_element(By.ID, "confirm-ok").click()
    assert "paused by" in wait_for(browser, "#action-result .notice", timeout=90).text
    wait_for(browser, "#actions [data-action='resume']")  # the page re-read the job: it is paused now

    paused = lakehouse.events("JOB_PAUSED")
    assert [e["trigger_job_id"] for e in paused] == ["customer_360"]
    audit = json.loads(paused[0]["payload"])
    assert audit["via"] == "ui" and "@" in audit["by"]
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

    (ask,) = lakehouse.events("RETRY_ASKED")
    audit = json.loads(ask["payload"])
    assert ask["trigger_job_id"] == "finance_close" and audit["via"] == "ui" and audit["reason"] == "ledger fixed"
    tokens = {e["idempotency_token"] for e in lakehouse.events("TRIGGER_REQUESTED") if e["trigger_job_id"] == "finance_close"}
    lakehouse.tick()
    (retry,) = lakehouse.events("RETRY_REQUESTED")
    assert retry["trigger_job_id"] == "finance_close" and retry["idempotency_token"] not in tokens
    lakehouse.wait_for_jobs()  # it fails again (exit 3): the job is back to FAILED, as it was
    assert lakehouse.job_status("finance_close") == {"FAILED"}


def test_an_operator_runs_a_job_now_from_its_page_once(operator_page, browser, lakehouse):
    """Run now: confirmed, audited (via ui), shown in the verdict until the next tick requests the run."""
    from selenium.webdriver.common.by import By

    browser.get(operator_page + "/#/jobs/orders_etl")
    wait_for(browser, "#actions [data-action='trigger']").click()
    dialog = wait_for(browser, "dialog#confirm[open]")
    assert "Trigger job orders_etl?" in dialog.text
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
        assert set(jobs) == {"orders_etl", "customer_360", "finance_close", "marketing_daily"}
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
