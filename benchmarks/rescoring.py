"""Re-scoring speed with the paired image-level bootstrap (``genshift.eval.bootstrap``).

What ``bench eval`` does after inference and ``bench verify`` does again: every ImageNet* metric
with 95% intervals from stored predictions, for 24 configs x 50,000 rows (1.2 M rows), with
1,000 bootstrap replicates that resample images (the same draws for every model). Synthetic
predictions (70% top-1 hits); ``--keep`` sets the fraction of rows the filter keeps (1.0 =
every row scored).

    python benchmarks/rescoring.py                 # 1.2 M rows, all kept, best of 3
    python benchmarks/rescoring.py --keep 0.6 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def tables(rows_per_config: int, configs: int, keep: float) -> dict:
    from genshift.eval.predictions import PredictionBlock, schema

    rng = np.random.default_rng(0)
    out = {}
    for c in range(configs):
        n = rows_per_config
        labels = rng.integers(0, 1000, n)
        topk = rng.integers(0, 1000, (n, 10))
        hit = rng.random(n) < 0.7
        topk[hit, 0] = labels[hit]
        blk = PredictionBlock(image_id=[f"c{c}/{i:06d}" for i in range(n)], label=labels, keep=rng.random(n) < keep,
                              pair_id=[None] * n, topk_idx=topk, topk_prob=rng.random((n, 10)).astype(np.float32),
                              true_prob=rng.random(n).astype(np.float32), true_rank=np.where(hit, 0, 20), carried={})
        out["base" if c == 0 else f"shift{c}"] = blk.to_table(schema(10))
    return out


def main(argv: list[str] | None = None) -> int:
    from genshift.eval.scoring import ScoringOptions, score

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000, help="rows per config")
    ap.add_argument("--configs", type=int, default=24, help="number of configs (base + shifts)")
    ap.add_argument("--keep", type=float, default=1.0, help="fraction of rows with keep=True")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates")
    ap.add_argument("--repeat", type=int, default=3, help="timed repetitions (best and all reported)")
    args = ap.parse_args(argv)
    t = tables(args.rows, args.configs, args.keep)
    opts = ScoringOptions(reference_config="base", n_boot=args.bootstrap)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        score("imagenet_star", t, opts)
        times.append(time.perf_counter() - t0)
    scored = sum(int(np.count_nonzero(x["keep"].to_numpy(zero_copy_only=False))) for x in t.values())
    print(json.dumps({"rows": args.rows * args.configs, "rows_scored": scored, "n_boot": args.bootstrap,
                      "seconds_best": round(min(times), 3), "seconds_all": [round(x, 3) for x in times],
                      "cpus": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
