"""Time the rows digest and the row checks that `LocalSuite.verify` runs, at ImageNet* scale.

    python benchmarks/rows_check_speed.py --rows 1200000

Builds the non-image columns of a suite config in memory (ids in random order, as shards hold
them), then times the reference `rows_digest` (pure Python), the vectorised
`rows_digest_table` and the whole `check_rows`. No image bytes: the row checks never read them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from genshift.suite_format import ConfigInfo, check_rows, rows_digest, rows_digest_table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_200_000, help="rows in the config (default 1200000)")
    ap.add_argument("--shards", type=int, default=24, help="shards the rows are split into (default 24)")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    n = args.rows
    ids = np.array([f"base/n{i % 1000:08d}/{i:07d}" for i in range(n)], dtype=object)
    rng.shuffle(ids)
    table = pa.table({"image_id": pa.array(ids, pa.string()), "label": pa.array(rng.integers(0, 1000, n), pa.int64()),
                      "keep": pa.array(rng.random(n) < 0.8), "config": pa.array(["base"] * n),
                      "pair_id": pa.array([None] * n, pa.string())})
    t0 = time.perf_counter()
    ref = rows_digest(table["image_id"].to_pylist(), table["label"].to_pylist(), table["keep"].to_pylist())
    t1 = time.perf_counter()
    vec = rows_digest_table(table)
    t2 = time.perf_counter()
    assert ref == vec
    step = -(-n // args.shards)
    shards = [(f"data/base/test-{i:05d}-of-{args.shards:05d}.parquet", table.slice(i * step, step))
              for i in range(args.shards)]
    info = ConfigInfo("base", n, int(table["keep"].to_numpy(zero_copy_only=False).sum()),
                      tuple(r for r, _ in shards), vec)
    t3 = time.perf_counter()
    check_rows(info, shards)
    t4 = time.perf_counter()
    print(f"{n} rows: rows_digest (reference) {t1 - t0:.2f} s, rows_digest_table {t2 - t1:.2f} s, "
          f"check_rows {t4 - t3:.2f} s; digest {vec}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
