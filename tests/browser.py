"""Real headless Chromium (Debian ``chromium`` + ``chromedriver``, through selenium) for the board's
browser tests: one way to start it and to open a page once the Streamlit server answers."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-dev-shm-usage", "--disable-background-networking", "--disable-component-update",
         "--disable-sync")


def chromium(profile: Path, *, window: str = "1600,1200"):
    """A headless Chromium driver with its own profile folder (no state shared between tests)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={window}"):
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def open_when_serving(driver, url: str, *, timeout: float = 60) -> None:
    """``driver.get(url)``, retried until the server has started (at most ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while True:
        try:
            driver.get(url)
            return
        except Exception:  # noqa: BLE001 - connection refused while the server starts
            if time.time() > deadline:
                raise
            time.sleep(1)


CHECKING = "Checking results"  # the progress bar of the board's background check


def until_checked(driver, *, timeout: float = 180, settle: float = 1.5) -> None:
    """Wait until the board's background check is over: its progress bar has stayed out of the page for
    ``settle`` seconds, longer than the bar's fragment's tick (1 s), which takes it out for a moment
    when it redraws."""
    from selenium.webdriver.common.by import By

    deadline, gone = time.time() + timeout, None
    while gone is None or time.time() - gone < settle:
        if time.time() > deadline:
            raise TimeoutError("the board's background check did not end")
        if CHECKING in driver.find_element(By.TAG_NAME, "body").text:
            gone = None
        elif gone is None:
            gone = time.time()
        time.sleep(0.2)
