"""Debian's headless Chromium driven by Selenium through Debian's chromedriver (`make setup` installs both).

The flags keep Chromium off the network: without the background-networking ones it keeps trying to reach
Google's services, which this closed machine cannot.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", "--window-size=1400,1500")


@contextmanager
def headless_chromium(profile: Path) -> Iterator[webdriver.Chrome]:
    """A fresh Chromium with its profile in `profile`; quit (browser and driver processes) on exit."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
