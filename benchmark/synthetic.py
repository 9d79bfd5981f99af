"""Deterministic synthetic suites for tests, benchmark scripts and offline demos (``bench demo-suite``): small noise
JPEGs from a numpy generator seeded by (config, class, index), so the same arguments write the same bytes."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from datasets import Value
from PIL import Image

from genshift.suite_format import Manifest, SuiteWriter


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
                         image_size: int = 64, seed: int = 0, overwrite: bool = False,
                         card: Callable[[Manifest], str] | None = None) -> Manifest:
    """Write a suite (format 1.1) and return its ``Manifest``; ``card``: e.g. ``genshift.data_cards.demo_card``.
    ``pairs=True``: ``pair_id = "<class>/<index>"`` on every row (the first config can play LANCE's ``original``);
    ``edit_types``: an ``edit_type`` column cycling through them."""
    extra = {"seed": Value("int64")}
    if edit_types:
        extra["edit_type"] = Value("string")
    items = [(c, i) for c in classes for i in range(per_class)]
    with SuiteWriter(root, suite_id=suite_id, extra_features=extra, overwrite=overwrite,
                     fingerprint={"synthetic": [list(configs), list(classes), per_class, seed, keep_fraction]}) as w:
        for ci, config in enumerate(configs):
            for shard in range(num_shards):
                if w.shard_done(config, shard, num_shards):
                    continue
                rows = []
                for c, i in items[shard::num_shards]:
                    row_seed = seed * 1_000_003 + ci * 100_003 + c * 1009 + i
                    rng = np.random.default_rng(row_seed)
                    rows.append({"image": {"bytes": synthetic_jpeg(rng, image_size), "path": None}, "label": int(c),
                                 "image_id": f"{config}/{c:03d}/{i:02d}", "config": config,
                                 "keep": bool(rng.random() < keep_fraction),
                                 "pair_id": f"{c:03d}/{i:02d}" if pairs else None, "seed": row_seed})
                    if edit_types:
                        rows[-1]["edit_type"] = edit_types[(c + i) % len(edit_types)]
                w.write_shard(config, shard, num_shards, rows)
        return w.finalize(generator={"builder": "genshift.synthetic", "seed": seed, "images": "noise"}, card=card)
