"""First paint of the board against Streamlit's own floor, in real headless Chromium, in one run.

    python benchmarks/leaderboard_load.py --models 4,500 --configs 30 --rows 100 --repeats 3

For each store size N: a synthetic store of N models x ``--configs`` configs, every entry signed by a
maintainer key the board trusts (so the official ranking is what is timed), served by `bench leaderboard
--results store --trusted-keys KEYS`; and the **floor**: a bare Streamlit app that only shows an
``st.dataframe`` of N rows and as many columns as the board's default ranking table, served by
`streamlit run` with the same flags. The arms alternate, each from a new server process (no warm
cache), ``--repeats`` times. Every time runs from the server's start (process spawned) to the first
cell of a table visible in a newly opened page. A fresh browser first opens the floor once, so that
Streamlit's scripts are in its HTTP cache for every timed arm, as for a returning visitor.

Prints one JSON object: per N the board's and the floor's times (seconds), their medians and
``ratio`` = board median / floor median (the goal: at most 1.25), and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIRST_CELL = "return !!Array.from(document.querySelectorAll(\"[data-testid='stDataFrame'] [role=gridcell]\"))" \
             ".find(c => c.textContent.trim())"
FLOOR_APP = """import numpy as np
import pandas as pd
import streamlit as st

rows, columns = {rows}, {columns}
st.dataframe(pd.DataFrame(np.random.default_rng(0).random((rows, columns)) * 100,
                          columns=[f"c{{i}}" for i in range(columns)]).assign(model=[f"m{{i}}" for i in range(rows)]))
"""


def first_cell(driver, url: str, t0: float, timeout: float = 600) -> float:
    """Seconds from ``t0`` until a new page of ``url`` shows a table cell (opened once the server answers)."""
    driver.get("about:blank")
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
    driver.get(url)
    while not driver.execute_script(FIRST_CELL):
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("no table cell")
        time.sleep(0.02)
    return time.perf_counter() - t0


def stop(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="4,500", help="store sizes, comma-separated (default: 4,500)")
    ap.add_argument("--configs", type=int, default=30)
    ap.add_argument("--rows", type=int, default=100, help="images per config")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from genshift.cli.leaderboard_cmd import STREAMLIT_FLAGS
    from tests.browser import chromium
    from tests.hubtools import free_port
    from tests.synthetic_store import make_store, sign_entry

    work = Path(tempfile.mkdtemp(prefix="genshift-board-"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = chromium(work / "chrome")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    columns = 11 + args.configs - 1  # the default ranking table: rank .. rank hi, and acc@1 per shift
    report: dict = {"configs": args.configs, "rows_per_config": args.rows, "sizes": {}}
    try:
        for n in (int(x) for x in args.models.split(",")):
            store, key = work / f"store-{n}", work / f"key-{n}"
            make_store(store, models=n, configs=args.configs, rows=args.rows)
            for p in sorted(store.glob("*/*/result.json")):
                sign_entry(p, key)
            floor = work / f"floor-{n}.py"
            floor.write_text(FLOOR_APP.format(rows=n, columns=columns))
            board_cmd = [sys.executable, "-m", "genshift", "leaderboard", "--results", str(store), "--port", str(port),
                         "--trusted-keys", f"{key}.pub"]
            floor_cmd = [sys.executable, "-m", "streamlit", "run", str(floor), "--server.port", str(port),
                         "--server.address", "127.0.0.1", *STREAMLIT_FLAGS]
            if not report["sizes"]:  # a fresh browser's first page: Streamlit's scripts fetched once
                server = subprocess.Popen(floor_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                report["fresh_browser_floor"] = first_cell(driver, url, time.perf_counter())
                stop(server)
            times: dict = {"board": [], "floor": []}
            for _ in range(args.repeats):
                for arm, cmd in (("board", board_cmd), ("floor", floor_cmd)):
                    t0 = time.perf_counter()
                    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    try:
                        times[arm].append(round(first_cell(driver, url, t0), 3))
                    finally:
                        stop(server)
                    print(n, arm, times[arm][-1], file=sys.stderr, flush=True)
            med = {arm: statistics.median(t) for arm, t in times.items()}
            report["sizes"][n] = {**times, "board_median": med["board"], "floor_median": med["floor"],
                                  "ratio": round(med["board"] / med["floor"], 3)}
    finally:
        driver.quit()
        shutil.rmtree(work, ignore_errors=True)
    report["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
