"""The status page with a few hundred jobs, in headless Chromium (see test_ui.py)."""

from __future__ import annotations

import time

from harness import Harness
from harness import config_row as row
from test_ui import browser, pytestmark, screenshot, serve, wait_for

from heartbeat_runner.interfaces.ui.actions import ActionPolicy


def _timed_load(browser, url: str, css: str, timeout: float) -> float:
    """Open ``url`` and wait for ``css``; the seconds that took (printed by the tests, never asserted)."""
    began = time.monotonic()
    browser.get(url)
    wait_for(browser, css, timeout=timeout)
    return time.monotonic() - began


def test_the_graph_stays_usable_at_three_hundred_jobs(tmp_path, browser):
    """300 jobs over 60 shared sources: every node drawn once, the sources' group folds into one node and
    back, and a filter narrows it to one job's neighbourhood. Prints how long the graph took to draw (not asserted: machines are noisy)."""
    from selenium.webdriver.common.by import By

    rows = [row("delta_table", f"lake.t{j % 60:02d}", f"job{j:03d}") for j in range(300)]
    rows += [row("delta_table", f"lake.t{(j + 7) % 60:02d}", f"job{j:03d}", hard="FALSE") for j in range(300)]
    with Harness(tmp_path) as hb:
        for t in range(60):
            hb.create_table(f"lake.t{t:02d}", "id INT")
        hb.seed(*rows)
        hb.tick()  # a runner that ticked: the page's header says so
        url, server = serve(hb, ActionPolicy(enabled=False))
        try:
            drawn = _timed_load(browser, url + "/#/graph", "#graph[data-nodes='360']", timeout=60)
            assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .node.job")) == 300
            assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .edge.soft")) == 300
            browser.find_element(By.CSS_SELECTOR, "#graph .group-label").click()  # fold the 60 sources into one
            wait_for(browser, "#graph[data-nodes='301'][data-edges='600']")  # a hard and a soft edge per job
            assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .node.group")) == 1
            browser.find_element(By.ID, "collapse-all").click()  # every group folded: the button unfolds them
            wait_for(browser, "#graph[data-nodes='360']")
            search = browser.find_element(By.ID, "search")
            search.send_keys("job042")
            wait_for(browser, "#graph[data-nodes='3']")  # the job, its hard and its soft source
            screenshot(browser, tmp_path, "ui-graph-300")
            print(f"\ngraph of 300 jobs / 60 sources / 600 edges drawn in {drawn:.2f} s")
        finally:
            server.shutdown()


def test_the_overview_of_five_thousand_jobs_puts_failures_first_and_pages(tmp_path, browser):
    """5,000 jobs, three of them failed (their ids sort last): the overview counts all 5,000, draws one
    page of 100 rows with the failures on top, pages forward and back, and a search finds one job on any
    page. Prints how long the first page took (not asserted: machines are noisy)."""
    from selenium.webdriver.common.by import By

    failing = [f"zz_fail_{i}" for i in range(3)]
    rows = [row("trigger_file", f"drops/d{j % 50:02d}", f"job{j:04d}") for j in range(5000 - len(failing))]
    rows += [row("trigger_file", "drops/failing", job) for job in failing]
    with Harness(tmp_path) as hb:
        hb.seed(*rows)
        hb.jobs(**dict.fromkeys(failing, 1))
        hb.tick()
        hb.drop_trigger_file("drops/failing", "ready")
        assert sorted(hb.tick().triggered_job_ids) == failing
        hb.wait_for_jobs()
        hb.tick()
        url, server = serve(hb, ActionPolicy(enabled=False))
        try:
            drawn = _timed_load(browser, url + "/", "#jobs tbody tr[data-job]", timeout=120)
            assert browser.find_element(By.ID, "job-count").text == "(5000)"
            shown = [r.get_attribute("data-job") for r in browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")]
            assert len(shown) == 100 and shown[:3] == failing, shown[:5]
            assert browser.find_element(By.ID, "page-of").text == "page 1 of 50"
            screenshot(browser, tmp_path, "ui-overview-5000")

            browser.find_element(By.ID, "next-page").click()
            wait_for(browser, "#jobs tbody tr[data-job='job0097']")  # 3 failures + job0000..job0096 on page 1
            assert browser.find_element(By.ID, "page-of").text == "page 2 of 50"
            browser.find_element(By.ID, "prev-page").click()
            wait_for(browser, f"#jobs tbody tr[data-job='{failing[0]}']")

            browser.find_element(By.ID, "search").send_keys("job4321")
            wait_for(browser, "#jobs tbody tr[data-job='job4321']")
            assert len(browser.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job]")) == 1
            assert browser.find_element(By.ID, "page-of").text == "page 1 of 1"
            print(f"\noverview of 5,000 jobs: first page drawn {drawn:.2f} s after the request")
        finally:
            server.shutdown()
