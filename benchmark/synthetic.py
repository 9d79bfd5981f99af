"""Deterministic synthetic suites for tests, benchmark scripts and offline demos.

    python -m genshift.synthetic --out /tmp/toy --configs base,in_the_snow --classes 10 --per-class 4

Images are small JPEGs whose colour depends on (config, class, index), generated from a seeded
``numpy`` generator, so two calls with the same arguments write byte-identical suites.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from datasets import Value
from PIL import Image

from genshift.writer import SuiteWriter
from genshift.data_cards import render_card


def synthetic_jpeg(rng: np.random.Generator, size: int = 64, quality: int = 90) -> bytes:
    base = rng.integers(0, 256, size=3)
    noise = rng.integers(-40, 40, size=(size, size, 3))
    arr = np.clip(base[None, None, :] + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def make_synthetic_suite(root: str | Path, *, suite_id: str = "toy", configs: Sequence[str] = ("base", "shifted"),
                         classes: Sequence[int] = tuple(range(10)), per_class: int = 4, num_shards: int = 1,
                         keep_fraction: float = 0.75, pairs: bool = False, edit_types: Sequence[str] = (),
                         image_size: int = 64, seed: int = 0, overwrite: bool = False):
    """Write a suite (format 1.1, with its dataset card) and return its ``Manifest``.

    With ``pairs=True`` every row of every config gets ``pair_id = "<class>/<index>"`` (so the
    first config can play LANCE's ``original`` and the others its counterfactuals). With
    ``edit_types`` an ``edit_type`` column cycles through them.
    """
    extra = {"seed": Value("int64")}
    if edit_types:
        extra["edit_type"] = Value("string")
    with SuiteWriter(root, suite_id=suite_id, extra_features=extra, overwrite=overwrite,
                     fingerprint={"synthetic": [list(configs), list(classes), per_class, seed, keep_fraction]}) as w:
        for ci, config in enumerate(configs):
            items = [(c, i) for c in classes for i in range(per_class)]
            for shard in range(num_shards):
                if w.shard_done(config, shard, num_shards):
                    continue

                def rows(shard=shard, ci=ci, config=config, items=items):
                    for k, (c, i) in enumerate(items):
                        if k % num_shards != shard:
                            continue
                        row_seed = seed * 1_000_003 + ci * 100_003 + c * 1009 + i
                        rng = np.random.default_rng(row_seed)
                        row = {
                            "image": {"bytes": synthetic_jpeg(rng, image_size), "path": None},
                            "label": int(c),
                            "image_id": f"{config}/{c:03d}/{i:02d}",
                            "config": config,
                            "keep": bool(rng.random() < keep_fraction),
                            "pair_id": f"{c:03d}/{i:02d}" if pairs else None,
                            "seed": row_seed,
                        }
                        if edit_types:
                            row["edit_type"] = edit_types[(c + i) % len(edit_types)]
                        yield row

                w.write_shard(config, shard, num_shards, rows())
        return w.finalize(generator={"builder": "genshift.synthetic", "seed": seed, "images": "noise"}, card=lambda m: render_card(
            m, template="generic", license="cc0-1.0", pretty_name=f"{suite_id} (synthetic test suite)",
            tags=["synthetic"], context={"note": "Synthetic noise images for tests and demos: every model is "
                                         "expected to score about 0% on them."}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the new suite folder (must not exist or be empty)")
    ap.add_argument("--suite-id", default="demo", help="the suite id written to the manifest (default: demo)")
    ap.add_argument("--configs", default="base,shifted", help="comma-separated config names (default: base,shifted)")
    ap.add_argument("--classes", type=int, default=10, help="use classes 0..N-1 (1..1000, default 10)")
    ap.add_argument("--per-class", type=int, default=4, help="images per class and config (default 4)")
    ap.add_argument("--shards", type=int, default=1, help="parquet shards per config (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the noise images (default 0)")
    args = ap.parse_args(argv)
    if not 1 <= args.classes <= 1000:
        ap.error(f"--classes must be 1..1000, got {args.classes}")
    if args.per_class < 1 or args.shards < 1:
        ap.error("--per-class and --shards must be >= 1")
    from genshift.errors import BenchError

    try:
        m = make_synthetic_suite(args.out, suite_id=args.suite_id, configs=args.configs.split(","),
                                 classes=range(args.classes), per_class=args.per_class, num_shards=args.shards,
                                 seed=args.seed)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"wrote {args.out}: {sum(c.rows for c in m.configs.values())} rows, manifest sha256 {m.sha256}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
