"""Leaderboard in-process costs: a synthetic, signed store of 500 models x 30 configs, loaded, aggregated,
rendered under Streamlit's AppTest, and the per-repaint changed-file check (browser figures:
benchmarks/leaderboard_load.py).

    python benchmarks/leaderboard_repaint.py --models 500 --configs 30 --rows 100

Reports (seconds):
- store_build: writing the synthetic store (not part of the goal);
- load_cold: first load, every entry checked like `bench verify` (schema, hashes, all metrics
  recomputed from predictions);
- load_warm: later loads (verification cached by content);
- aggregate: model table + ID/OOD fits + paired-bootstrap rank intervals over all models;
- app_first_render_new_process: the app's first run under AppTest in a fresh process (includes
  Streamlit's one-off component scan and imports);
- app_first_render: a new session's first full run (in-memory caches cleared, warm disk caches);
- app_rerun: a filter change (cached tables);
- restart_first_table: a restarted server (new loader, in-memory caches cleared) over the checked
  store: time to the first full run of the app, which paints from the store's index;
- cold_first_table: a never-seen store (verification cache, index and rank caches removed): time
  to the app's first run, with the number of rows in that first table (the background check goes
  on) and cold_full_check, the time until the background check has finished;
- repaint_stat_check: what every repaint adds to notice changed files (``store.refresh_store`` on an
  unchanged store: a stat of every file of every entry; median of 5), and repaint_one_changed: the
  same after one predictions file was replaced (that entry hashed and checked again, the board
  reassembled).

Every entry carries a signed stamp trusted through ``GENSHIFT_TRUSTED_KEYS`` (only verified entries
are ranked, so an unsigned store would measure a board without a ranking).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def _join_background_checks() -> None:
    """Wait for the background store checks of earlier sessions: each measurement starts from a quiet process."""
    import threading

    for th in threading.enumerate():
        if th.name == "genshift-store-check":
            th.join()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--configs", type=int, default=30)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--store", help="reuse an existing synthetic store folder")
    args = ap.parse_args(argv)

    from genshift.leaderboard import aggregate
    from genshift.leaderboard.store import load_store
    from genshift.leaderboard.synthetic import make_store, sign_entry

    report = {"models": args.models, "configs": args.configs, "rows_per_config": args.rows}
    root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="genshift-board-")) / "store"
    if not (root / "imagenet-star").exists():
        t = time.perf_counter()
        make_store(root, models=args.models, configs=args.configs, rows=args.rows)
        report["store_build"] = time.perf_counter() - t
    key = root.parent / "maintainer.key"
    if not key.exists():
        for p in sorted(root.glob("*/*/result.json")):
            sign_entry(p, key)
    os.environ["GENSHIFT_TRUSTED_KEYS"] = f"{key}.pub"
    from genshift.leaderboard.store import _cache_path
    cache = _cache_path(root, None)  # the verification cache lives in the user's cache folder, not the store
    cache.unlink(missing_ok=True)
    t = time.perf_counter()
    store = load_store(str(root), trusted_keys=f"{key}.pub")
    report["load_cold"] = time.perf_counter() - t
    t = time.perf_counter()
    store = load_store(str(root), trusted_keys=f"{key}.pub")
    report["load_warm"] = time.perf_counter() - t
    entries = store.for_suite("imagenet-star")
    t = time.perf_counter()
    aggregate.model_table(entries)
    aggregate.slope_fits(entries)
    configs = [c for c in entries[0].result["suite"]["configs"] if c != "base"]
    ranks = aggregate.rank_intervals(entries, family="imagenet_star", configs=configs)
    report["aggregate"] = time.perf_counter() - t
    report["rank_interval_mean_width"] = sum(r.hi - r.lo for r in ranks.values()) / len(ranks)

    from streamlit.testing.v1 import AppTest
    os.environ["GENSHIFT_RESULTS"] = str(root)
    app = Path(__file__).resolve().parents[1] / "leaderboard" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=600)
    t = time.perf_counter()
    at.run()
    report["app_first_render_new_process"] = time.perf_counter() - t  # includes AppTest's one-off start-up
    assert not at.exception, at.exception
    import streamlit as st
    st.cache_data.clear()
    st.cache_resource.clear()
    at = AppTest.from_file(str(app), default_timeout=600)
    t = time.perf_counter()
    at.run()
    report["app_first_render"] = time.perf_counter() - t  # a new session, no in-memory caches
    assert not at.exception, at.exception
    t = time.perf_counter()
    at.checkbox(key="verified").check().run()
    at.checkbox(key="verified").uncheck().run()
    report["app_rerun"] = (time.perf_counter() - t) / 2

    # a restarted server: a new loader paints from the index written after the last full check
    _join_background_checks()
    st.cache_data.clear()
    st.cache_resource.clear()
    at = AppTest.from_file(str(app), default_timeout=600)
    t = time.perf_counter()
    at.run()
    report["restart_first_table"] = time.perf_counter() - t
    report["restart_first_table_rows"] = len(at.dataframe[0].value) if at.dataframe else 0
    _join_background_checks()  # the restarted server's background check finishes before the store is wiped

    # a never-seen store: no verification cache, no index, no cached ranks
    import shutil

    from genshift.leaderboard.index import index_path
    cache.unlink(missing_ok=True)
    index_path(root).unlink(missing_ok=True)
    shutil.rmtree(cache.parent / (cache.stem + "-hits"), ignore_errors=True)
    st.cache_data.clear()
    st.cache_resource.clear()
    at = AppTest.from_file(str(app), default_timeout=600)
    t = time.perf_counter()
    at.run()
    report["cold_first_table"] = time.perf_counter() - t
    report["cold_first_table_rows"] = len(at.dataframe[0].value) if at.dataframe else 0
    report["cold_first_table_progress_bar"] = bool(at.get("progress"))
    _join_background_checks()
    report["cold_full_check"] = time.perf_counter() - t

    import statistics

    from genshift.leaderboard.store import refresh_store
    times = []
    for _ in range(5):
        t = time.perf_counter()
        assert refresh_store(store, trusted_keys=f"{key}.pub") is store  # nothing changed: the same store
        times.append(time.perf_counter() - t)
    report["repaint_stat_check"] = statistics.median(times)
    a, b = store.entries[0].run_dir, store.entries[1].run_dir
    cfg = store.entries[0].result["predictions"][-1]["path"]
    shutil.copyfile(b / cfg, a / cfg)
    t = time.perf_counter()
    fresh = refresh_store(store, trusted_keys=f"{key}.pub")
    report["repaint_one_changed"] = time.perf_counter() - t
    assert len(fresh.rejected) == len(store.rejected) + 1
    report["files_per_entry"] = len(store.entries[0].file_keys)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in report.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
