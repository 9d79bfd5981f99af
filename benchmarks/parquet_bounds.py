"""Measure what the parquet bounds of `genshift.suite_format` rest on.

    python benchmarks/parquet_bounds.py

1. Footer bytes per row group of a `SuiteWriter` shard (100 rows per group, the required columns)
   for several image sizes: parquet keeps min/max statistics of binary values up to 4 KiB, so
   images just under that size give the largest footer.
2. The cost of reading one row group when the shard is reopened for every group (its footer
   parsed each time: quadratic over a shard) and when it stays open (`genshift.suite_format.read_row_group`),
   for shards of 2048 and 40,000 one-row groups.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from genshift.suite_format import RowGroup, SuiteWriter, read_row_group


def _footer_bytes(path: Path) -> int:
    with open(path, "rb") as f:
        f.seek(-8, 2)
        return int.from_bytes(f.read(4), "little")


def _shard(root: Path, *, rows: int, image_bytes: int, rows_per_group: int) -> Path:
    with SuiteWriter(root, suite_id="m", rows_per_group=rows_per_group) as w:
        w.write_shard("base", 0, 1, ({"image": {"bytes": os.urandom(image_bytes), "path": None}, "label": 1,
                                      "image_id": f"base/{i:06d}", "config": "base", "keep": True, "pair_id": None}
                                     for i in range(rows)))
    return root / "data" / "base" / "test-00000-of-00001.parquet"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, nargs="+", default=[2048, 40000], help="one-row groups per shard to time")
    ap.add_argument("--reads", type=int, default=200, help="row groups read per timing (default 200)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for image_bytes in (600, 3000, 4000, 5000, 20000):
            path = _shard(tmp / f"f{image_bytes}", rows=5000, image_bytes=image_bytes, rows_per_group=100)
            print(f"images of {image_bytes:>5} bytes: footer {_footer_bytes(path) // 50} bytes per 100-row group")
        for groups in args.groups:
            path = _shard(tmp / f"g{groups}", rows=groups, image_bytes=100, rows_per_group=1)
            n = min(args.reads, groups)
            t0 = time.perf_counter()
            for i in range(n):
                pq.ParquetFile(path).read_row_group(i, columns=["image", "image_id"])
            reopen = (time.perf_counter() - t0) / n
            t0 = time.perf_counter()
            for i in range(n):
                read_row_group(path.parents[2], RowGroup("base", str(path.relative_to(path.parents[2])), i, 1),
                               columns=["image", "image_id"])
            cached = (time.perf_counter() - t0) / n
            print(f"{groups} one-row groups (footer {_footer_bytes(path)} bytes): {1000 * reopen:.2f} ms per group "
                  f"reopened, {1000 * cached:.3f} ms kept open")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
