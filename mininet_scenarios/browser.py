"""Headless Chromium under Selenium, for pictures of the operator's web page.

The testbed (mininet_scenarios/observe.py) and benchmarks/web_page.py take screenshots with it;
it uses Debian's chromium and chromedriver (scripts/install.sh) and downloads nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_missing() -> str | None:
    """Why the browser test cannot run (None when chromium and chromedriver are there)."""
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists() and not shutil.which(Path(path).name):
            return f"{pkg} is not installed (apt-get install chromium chromium-driver)"
    return None


def start_browser(width: int = 1400, height: int = 1500):
    """Headless Chromium under Selenium with the system chromedriver.

    It accepts any server certificate: the controller's comes from a CA made for this run
    (the page's content is compared with REST read over CA-verified TLS).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--ignore-certificate-errors", f"--window-size={width},{height}",
                "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    service = Service(executable_path=shutil.which("chromedriver") or CHROMEDRIVER)
    return webdriver.Chrome(service=service, options=options)
