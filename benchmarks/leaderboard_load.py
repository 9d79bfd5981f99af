"""Leaderboard paint times in a real browser: a synthetic store of 500 models x 30 configs served by
`bench leaderboard` and opened in headless Chromium (Debian ``chromium`` + ``chromedriver``, selenium).

    python benchmarks/leaderboard_load.py --models 500 --configs 30 --rows 100

Every time is measured from the moment `bench leaderboard --results store` (the documented relative
form) is started, through Streamlit's start-up, the page load and the app's first run, to the first
row of the ranking table visible in the page (a cell of the data grid). Reports (seconds):

- store_build: writing the synthetic store (not part of any goal);
- cold_first_row: a never-seen store (verification cache, index and rank caches removed), with the
  rows that first view counts (``cold_first_rows``: "N results" in the page) and cold_full_check,
  until the background check has finished (the progress bar is gone);
- restart_first_row (``--restarts`` times): the server stopped with SIGTERM and started again over
  the checked store: painted from the index (``restart_first_rows``); restart_server_up: the part
  until the server answered its health check (Streamlit's start-up, before any page);
- view_first_row: a new page (a new session) on the running server, caches warm;
- floor_first_row (``--restarts`` times; the baseline, same browser and run): a bare Streamlit app that
  only shows a 500-row ``st.dataframe``, started with `streamlit run` and the same flags: what any
  Streamlit page costs on this machine (floor_server_up: until its health check answered);
- fresh_browser_floor_first_row: that bare app once before everything else, in the new browser (its
  HTTP cache empty): Streamlit's scripts are then cached for every arm above, as for a returning
  visitor (before 2026-11-25 the cold arm was the new browser's first page and paid for them);
- stop_s: SIGTERM to `bench leaderboard` until its port is closed.

Every entry carries a maintainer's signed stamp, trusted through ``--trusted-keys`` (only verified
entries are ranked: an unsigned store would time the community table, not the official ranking);
``*_ranked`` is the number of rows of the official ranking in that view. ``--no-cold`` skips the
never-seen run (restarts over a store checked by an earlier run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GRID_CELL = "return !!Array.from(document.querySelectorAll(\"[data-testid='stDataFrame'] [role=gridcell]\"))" \
            ".find(c => c.textContent.trim())"
CHECKING = "Checking results in the background"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chrome(profile: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1600,1200"):
        opts.add_argument(flag)
    opts.binary_location = shutil.which("chromium")
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def _serve(store: Path, port: int, env: dict, keys: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "genshift", "leaderboard", "--results", store.name, "--port",
                             str(port), "--trusted-keys", str(keys)], cwd=store.parent, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _first_row(driver, url: str, t0: float, timeout: float = 600, up: dict | None = None) -> tuple[float, int | None]:
    """Seconds from ``t0`` until the table's first cell is visible in a newly opened page, and the
    "N results" of that view. The page is opened as soon as the server answers its health check
    (``up["s"]``: seconds from ``t0`` until it did; ``up["ranked"]``: the ranking's row count in the
    view, from its caption, 0 if nothing is ranked)."""
    import urllib.request

    driver.get("about:blank")  # no page of an earlier server left reconnecting
    while True:
        try:
            with urllib.request.urlopen(url + "_stcore/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("the server never answered")
        time.sleep(0.02)
    if up is not None:
        up["s"] = time.perf_counter() - t0
    driver.get(url)
    while not driver.execute_script(GRID_CELL):
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("no table row")
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    text = driver.execute_script("return document.body.innerText")
    m = re.search(r"\| (\d+) results", text)
    if up is not None:
        ranked = re.search(r"Ranks are among the (\d+) verified", text)
        up["ranked"] = int(ranked.group(1)) if ranked else 0
    return seconds, int(m.group(1)) if m else None


FLOOR_APP = """import pandas as pd
import streamlit as st
st.dataframe(pd.DataFrame({"model": [f"m{i}" for i in range(500)], "acc": [0.5] * 500}))
"""


def _serve_floor(app: Path, port: int, env: dict) -> subprocess.Popen:
    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS

    return subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(app), "--server.port", str(port),
                             "--server.address", "127.0.0.1", *STREAMLIT_FLAGS], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _log(report: dict) -> None:
    print({k: round(v, 2) if isinstance(v, float) else v for k, v in report.items()}, file=sys.stderr, flush=True)


def _stop(server: subprocess.Popen, port: int) -> float:
    t = time.perf_counter()
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} still served after SIGTERM")
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--configs", type=int, default=30)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--store", help="reuse an existing synthetic store folder")
    ap.add_argument("--no-cold", action="store_true", help="skip the never-seen run: restarts over the store as "
                                                           "an earlier run left it checked")
    args = ap.parse_args(argv)

    from genshift.leaderboard.index import index_path
    from genshift.leaderboard.store import _cache_path
    from genshift.leaderboard.synthetic import make_store, sign_entry

    work = Path(tempfile.mkdtemp(prefix="genshift-board-"))
    root = Path(args.store).resolve() if args.store else work / "store"
    report = {"store": str(root)}
    if not (root / "imagenet-star").exists():
        report.update(models=args.models, configs=args.configs, rows_per_config=args.rows)
        t = time.perf_counter()
        make_store(root, models=args.models, configs=args.configs, rows=args.rows)
        report["store_build"] = time.perf_counter() - t
    key = root.parent / "maintainer.key"
    if not key.exists():  # the maintainer signs every entry, so the official ranking is what is timed
        for p in sorted(root.glob("*/*/result.json")):
            sign_entry(p, key)
    keys = Path(f"{key}.pub")
    if not args.no_cold:  # a never-seen store: no verification cache, no index, no cached ranks
        cache = _cache_path(root, None)
        cache.unlink(missing_ok=True)
        index_path(root).unlink(missing_ok=True)
        shutil.rmtree(cache.parent / (cache.stem + "-hits"), ignore_errors=True)

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    for k in ("GENSHIFT_TRUSTED_KEYS", "GENSHIFT_ID_ACCURACY", "GENSHIFT_SUITES"):
        env.pop(k, None)
    driver = _chrome(work / "chrome")
    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    app = work / "floor_app.py"
    app.write_text(FLOOR_APP)
    try:
        # a new browser's first Streamlit page (its HTTP cache empty: Streamlit's scripts are fetched and
        # compiled once), on the port every later page uses, so each arm below finds them cached as a
        # returning visitor does; the never-seen *store* is what the cold arm times
        t0 = time.perf_counter()
        server = _serve_floor(app, port, env)
        report["fresh_browser_floor_first_row"], _ = _first_row(driver, url, t0)
        _stop(server, port)
        if not args.no_cold:
            t0 = time.perf_counter()
            server = _serve(root, port, env, keys)
            up: dict = {}
            report["cold_first_row"], report["cold_first_rows"] = _first_row(driver, url, t0, up=up)
            report["cold_first_ranked"] = up["ranked"]
            _log(report)
            # finished once the progress bar stays gone for longer than its fragment's tick (1 s): a fragment's
            # rerun can take its bar out of the page for a moment
            gone = None
            while gone is None or time.perf_counter() - gone < 1.5:
                if CHECKING in driver.execute_script("return document.body.innerText"):
                    gone = None
                elif gone is None:
                    gone = time.perf_counter()
                time.sleep(0.2)
            report["cold_full_check"] = gone - t0
            deadline = time.perf_counter() + 120
            while not index_path(root).is_file():  # written after the board is published, for the restarts
                if time.perf_counter() > deadline:
                    raise TimeoutError("the board never wrote its index (see the server's log)")
                time.sleep(0.1)
            _, report["cold_final_rows"] = _first_row(driver, url, time.perf_counter(), up=up)
            report["cold_final_ranked"] = up["ranked"]
            report["stop_s"] = _stop(server, port)
            _log(report)
        for i in range(args.restarts):
            t0 = time.perf_counter()
            server = _serve(root, port, env, keys)
            up = {}
            report[f"restart_first_row_{i + 1}"], report[f"restart_first_rows_{i + 1}"] = _first_row(driver, url, t0,
                                                                                                     up=up)
            report[f"restart_server_up_{i + 1}"] = up["s"]
            report[f"restart_first_ranked_{i + 1}"] = up["ranked"]
            _log(report)
            while CHECKING in driver.execute_script("return document.body.innerText"):
                time.sleep(0.2)  # the background re-check ends before the next measurement
            if i + 1 < args.restarts:
                _stop(server, port)
        report["view_first_row"], _ = _first_row(driver, url, time.perf_counter())
        report["stop_s_after_restarts"] = _stop(server, port)
        for i in range(args.restarts):
            t0 = time.perf_counter()
            server = _serve_floor(app, port, env)
            up = {}
            report[f"floor_first_row_{i + 1}"], _ = _first_row(driver, url, t0, up=up)
            report[f"floor_server_up_{i + 1}"] = up["s"]
            _stop(server, port)
            _log(report)
    finally:
        driver.quit()
        if "server" in locals() and server.poll() is None:
            server.kill()
    report["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
