"""Headless Chromium driven by Selenium (Debian's chromium + chromium-driver): the browser of the status
page's tests and of benchmarks/ui_soak.py, opened the same way in both."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
#: Chromium's flags: no display, no sandbox (containers), /tmp instead of a small /dev/shm
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1400,900")


@contextlib.contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Selenium Chrome driver on headless Chromium, quit on exit (lookups do not wait implicitly)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "chromium"
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER or "chromedriver"), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()
