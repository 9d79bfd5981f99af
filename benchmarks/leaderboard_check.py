"""Leaderboard check costs in-process, paired arms back to back on one synthetic signed store:

    python benchmarks/leaderboard_check.py --store S [--models 500 --configs 30 --rows 100] [--repeat 2]

- full check of a never-seen store (verification cache removed before each run), ``load_store``
  in this process (``workers=1``) against a pool of one process per core (``genshift.leaderboard.check_pool``),
  alternated A B A B; with the entries each worker process checked;
- what a restart reads before its first view: the index's head (``read_head``: HMAC, the first
  view, a stat of every file) against the whole index (``read_index``: head and body, every entry
  rebuilt), median of 5 each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="a synthetic store folder (made if absent)")
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--configs", type=int, default=30)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)

    from genshift.leaderboard import index
    from genshift.leaderboard.store import _cache_path, load_store
    from genshift.leaderboard.synthetic import make_store, sign_entry

    root = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="genshift-board-")) / "store"
    if not (root / "imagenet-star").exists():
        make_store(root, models=args.models, configs=args.configs, rows=args.rows)
    key = root.parent / "maintainer.key"
    if not key.exists():
        for p in sorted(root.glob("*/*/result.json")):
            sign_entry(p, key)
    keys = f"{key}.pub"
    report: dict = {"store": str(root), "entries": len(list(root.glob("*/*/result.json")))}
    for arm in [a for _ in range(args.repeat) for a in ("serial", "pool")]:
        _cache_path(root, None).unlink(missing_ok=True)
        t = time.perf_counter()
        store = load_store(str(root), trusted_keys=keys, workers=1 if arm == "serial" else None)
        report.setdefault(f"full_check_{arm}", []).append(round(time.perf_counter() - t, 2))
        report[f"checked_by_{arm}"] = sorted(store.checked_by.values())
    index.write_index(store, keys_digest=index._keys_digest(keys))
    digest = index._keys_digest(keys)
    for name, fn in (("head", lambda: index.read_head(root, None, keys_digest=digest)),
                     ("whole_index", lambda: index.read_index(str(root), root, None, keys_digest=digest))):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            assert fn() is not None
            times.append(time.perf_counter() - t)
        report[f"restart_read_{name}"] = round(statistics.median(times), 3)
    path = index.index_path(root)
    with open(path, "rb") as f:
        f.readline()
        report["index_bytes"], report["head_bytes"] = path.stat().st_size, len(f.readline())
    report["load_average_1min"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
