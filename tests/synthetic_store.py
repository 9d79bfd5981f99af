"""Synthetic results stores for the board's tests and ``benchmarks/leaderboard_load.py`` (test tooling, not
library): valid results + predictions that pass ``bench verify``, for many models without running any
(:func:`make_store`, :func:`write_model`), and a maintainer's signed record for them (:func:`sign_entry`).

Each model gets a latent skill; its per-image correctness on each config is drawn around it, with
shared image difficulty so that models are correlated as real ones are. Metrics are computed by
``genshift.eval.scoring.score`` exactly as ``bench eval`` does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from genshift.eval.predictions import PredictionBlock, schema
from genshift.eval.results import KIND, SCHEMA_VERSION, config_hash, path_slug, write_result
from genshift.eval.scoring import ScoringOptions, score
from genshift.fsutil import sha256_bytes, sha256_file
from genshift.identity import folder_name

ARCHS = [("resnet50", "a1_in1k", 25.6e6), ("vit_base_patch16_224", "augreg_in21k_ft_in1k", 86.6e6),
         ("convnext_tiny", "fb_in1k", 28.6e6), ("efficientnet_b0", "ra_in1k", 5.3e6),
         ("deit3_small_patch16_224", "fb_in22k_ft_in1k", 22.1e6), ("tf_efficientnet_lite0", "in1k", 4.7e6)]


SYNTHETIC_MANIFEST = "5" * 64  # no suite has this manifest: synthetic entries are never checked against one


def write_model(root: Path, *, suite_id: str, configs: list[str], model_id: str, architecture: str, tag: str,
                num_params: float, skill: float, difficulty: dict, rng: np.random.Generator,
                family: str = "imagenet_star", manifest: str = SYNTHETIC_MANIFEST, notes: str = "",
                flags: dict | None = None, finished_at: str = "2026-11-01T00:00:00+00:00",
                weights_sha256: str | None = None, tensors_sha256: str | None = None, source: str = "hf-hub",
                paper_ids: str | None = None) -> Path:
    """One valid entry under ``root``. ``model_id`` must be the canonical id of what it records
    (``genshift.identity``): ``ORG/NAME`` with ``source="hf-hub"``, ``<architecture>@sha256:<16 hex of
    tensors_sha256>`` for local weights (``source="checkpoint"``)."""
    run = root / path_slug(suite_id) / folder_name(model_id)
    (run / "predictions").mkdir(parents=True, exist_ok=True)
    tables, preds = {}, []
    for ci, c in enumerate(configs):
        d = difficulty[c]
        n = d.size
        p_hit = 1 / (1 + np.exp(-(skill - d - 0.3 * (ci > 0))))
        hit = rng.random(n) < p_hit
        labels = (np.arange(n) * 7 + ci) % 1000
        # internally consistent rows (as `bench verify` checks them): distinct top-10 classes, descending
        # probabilities summing to 0.9; a hit has the label first, a miss ranks it 20th below the top-10
        rng.integers(0, 1000, (n, 10))  # the draw earlier versions used: keeps every model's hits as they were
        others = (labels[:, None] + 1 + np.arange(10) * 37) % 1000
        topk = np.where(hit[:, None], np.concatenate([labels[:, None], others[:, :9]], axis=1), others)
        r = np.sort(rng.random((n, 10)), axis=1)[:, ::-1] + 0.01
        probs = (r / r.sum(axis=1, keepdims=True) * 0.9).astype(np.float32)
        block = PredictionBlock(
            image_id=[f"{c}/{i:06d}" for i in range(n)], label=labels, keep=np.arange(n) % 10 != 0,
            pair_id=[None] * n, topk_idx=topk, topk_prob=probs,
            true_prob=np.where(hit, probs[:, 0], probs[:, -1] / 2).astype(np.float32),
            true_rank=np.where(hit, 0, 20), carried={})
        t = block.to_table(schema(10))
        import pyarrow.parquet as pq
        path = run / "predictions" / f"{c}.parquet"
        pq.write_table(t, path)
        tables[c] = t
        preds.append({"config": c, "path": f"predictions/{c}.parquet", "rows": t.num_rows, "sha256": sha256_file(path)})
    opts = ScoringOptions(reference_config="base" if family == "imagenet_star" else None, n_boot=200)
    hub = source == "hf-hub"
    weights_sha256 = weights_sha256 or sha256_bytes(model_id.encode())
    model = {"id": model_id, "architecture": architecture, "tag": tag, "source": source,
             "weights_revision": "0" * 40 if hub else None, "num_params": int(num_params),
             "weights_sha256": weights_sha256, "tensors_sha256": tensors_sha256 or weights_sha256,
             "pretrained_cfg": {"hf_hub_id": model_id, "paper_ids": paper_ids} if hub else {}}
    suite = {"id": suite_id, "repo_id": None, "revision": None, "pinned": True, "manifest_sha256": manifest,
             "suite_version": "1.0.0", "configs": configs, "metric_family": family, "source": suite_id}
    data_config = {"input_size": [3, 224, 224], "interpolation": "bicubic", "mean": [0.485, 0.456, 0.406],
                   "std": [0.229, 0.224, 0.225], "crop_pct": 0.875, "crop_mode": "center"}
    protocol = {"topk": 10, "limit_per_class": None, "skip_bad_images": False, "scoring": opts.to_dict()}
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND, "model": model, "data_config": data_config, "suite": suite,
        "protocol": protocol, "config_hash": config_hash(model, suite, protocol, data_config),
        "run": {"device": "cpu", "synthetic": True}, "environment": {"genshift_bench": "synthetic"},
        "started_at": finished_at, "finished_at": finished_at,
        "counts": {c: {"total": t.num_rows, "kept": int(np.sum(t["keep"].to_numpy(zero_copy_only=False))),
                       "predicted": t.num_rows, "skipped_bad": 0, "skipped_bad_ids": []} for c, t in tables.items()},
        "metrics": score(family, tables, opts), "predictions": preds,
        "flags": {"unpinned_suite": False, "construction_model": False, "partial": False, "skipped_bad_images": False,
                  **(flags or {})},
        "notes": notes,
    }
    path = run / "result.json"
    write_result(path, result)
    return path


def sign_entry(result_path: str | Path, key_path: str | Path, *,
               verified_at: str = "2026-11-01T00:00:00+00:00") -> Path:
    """A maintainer's signed record (the format ``bench verify --sign`` writes) for an entry whose model cannot
    be re-run (a synthetic one): for tests and benchmarks of the verified path. Creates the key if absent."""
    import json

    from genshift.eval import stamps
    from genshift.eval.predictions import read_predictions
    from genshift.fsutil import atomic_write_bytes

    result_path, key_path = Path(result_path), Path(key_path)
    if not key_path.exists():
        stamps.generate_key(key_path)
    r = json.loads(result_path.read_bytes())
    files = {p["path"]: result_path.parent / p["path"] for p in r["predictions"]}
    record = stamps.build_record(r, result_sha256=sha256_file(result_path),
                                 predictions_sha256={k: sha256_file(f) for k, f in files.items()},
                                 tables={p["config"]: read_predictions(files[p["path"]]) for p in r["predictions"]})
    record.update(recheck={"n": 20, "seed": 1, "images": []}, checks=["synthetic"], verified_at=verified_at)
    out = result_path.parent / stamps.STAMP_FILE
    atomic_write_bytes(out, stamps.sign(record, stamps.load_private_key(key_path)))
    return out


def make_store(root: str | Path, *, models: int = 12, configs: int = 6, rows: int = 200, seed: int = 0,
               suite_id: str = "imagenet-star") -> list[Path]:
    root = Path(root)
    rng = np.random.default_rng(seed)
    names = ["base"] + [f"shift_{i:02d}" for i in range(1, configs)]
    difficulty = {c: rng.normal(0, 1.2, rows) for c in names}
    paths = []
    for m in range(models):
        arch, tag, params = ARCHS[m % len(ARCHS)]
        paths.append(write_model(root, suite_id=suite_id, configs=names, model_id=f"timm/{arch}.{tag}-v{m}",
                                 architecture=arch, tag=tag, num_params=params, skill=rng.normal(1.0, 0.6),
                                 difficulty=difficulty, rng=rng))
    return paths
