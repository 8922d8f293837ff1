"""The status page with a few hundred jobs, in headless Chromium (see test_ui.py)."""

from __future__ import annotations

from harness import Harness
from harness import config_row as row
from test_ui import browser, pytestmark, screenshot, serve, wait_for

from heartbeat_runner.interfaces.ui.actions import ActionPolicy


def test_the_graph_stays_usable_at_three_hundred_jobs(tmp_path, browser):
    """300 jobs over 60 shared sources: every node drawn once, and a filter narrows it to one job's
    neighbourhood. Prints how long the graph took to draw (not asserted: machines are noisy)."""
    import time

    from selenium.webdriver.common.by import By

    rows = [row("delta_table", f"lake.t{j % 60:02d}", f"job{j:03d}") for j in range(300)]
    rows += [row("delta_table", f"lake.t{(j + 7) % 60:02d}", f"job{j:03d}", hard="FALSE") for j in range(300)]
    with Harness(tmp_path) as hb:
        for t in range(60):
            hb.create_table(f"lake.t{t:02d}", "id INT")
        hb.seed(*rows)
        url, server = serve(hb, ActionPolicy(enabled=False))
        try:
            began = time.monotonic()
            browser.get(url + "/#/graph")
            wait_for(browser, "#graph[data-nodes='360']", timeout=60)
            drawn = time.monotonic() - began
            assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .node.job")) == 300
            assert len(browser.find_elements(By.CSS_SELECTOR, "#graph .edge.soft")) == 300
            search = browser.find_element(By.ID, "search")
            search.send_keys("job042")
            wait_for(browser, "#graph[data-nodes='3']")  # the job, its hard and its soft source
            screenshot(browser, tmp_path, "ui-graph-300")
            print(f"\ngraph of 300 jobs / 60 sources / 600 edges drawn in {drawn:.2f} s")
        finally:
            server.shutdown()
