"""Real headless Chromium (Debian ``chromium`` + ``chromedriver``, through selenium) for the board's
browser tests: one way to start it, to serve a board with ``bench leaderboard``, and to wait for the page on
conditions (never on time)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def serve(results, port: int, *args: str) -> subprocess.Popen:
    """``bench leaderboard --results RESULTS --port PORT ARGS`` in its own process (the server itself)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "genshift", "leaderboard", "--results", str(results), "--port",
                             str(port), *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def open_when_serving(driver, url: str, *, timeout: float = 90) -> None:
    """``driver.get(url)``, retried until the server has started (at most ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while True:
        try:
            driver.get(url)
            return
        except Exception:  # noqa: BLE001 - connection refused while the server starts
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def until(driver, condition, *, timeout: float = 180):
    """``condition(driver)``'s first truthy value, re-evaluated on every poll; an element replaced while it is
    read (a repaint) is read again, never an error."""
    from selenium.common.exceptions import JavascriptException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25,
                         ignored_exceptions=(StaleElementReferenceException, JavascriptException)).until(condition)


def idle(driver) -> bool:
    """Whether the page's script run is over (Streamlit's own state on the app root) and a table is on it."""
    return driver.execute_script(
        "const a = document.querySelector('[data-testid=stApp]');"
        "return !!a && a.getAttribute('data-test-script-state') === 'notRunning' &&"
        " !!document.querySelector(\"[data-testid='stDataFrame'] [role=gridcell]\")")


def top10(driver) -> list[str]:
    """The models of the "Top 10 as text" block, in rank order (read from the page, open or closed)."""
    text = driver.execute_script("const e = Array.from(document.querySelectorAll('[data-testid=stExpander]'))"
                                 ".find(e => e.textContent.includes('Top 10 as text'));"
                                 "const t = e && e.querySelector('[data-testid=stText]');"
                                 " return t ? t.textContent : ''")
    return [line.split()[1] for line in text.splitlines() if line.strip()[:1].isdigit()]


def cells(driver) -> list[str]:
    return driver.execute_script("return Array.from(document.querySelectorAll(\"[data-testid='stDataFrame'] "
                                 "[role=gridcell]\")).map(c => c.textContent)")
