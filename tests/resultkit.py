"""A schema-valid result record with made-up numbers, for tests of cross-model code (slope, shift impact)."""

from genshift.eval.results import KIND, SCHEMA_VERSION
from genshift.eval.scoring import ScoringOptions


def model_record(name: str, source: str = "hf-hub") -> dict:
    """A canonical model record (``genshift.identity``) for a name in any form: Hub weights as ``ORG/NAME``
    (``timm/`` added to a bare timm name), local weights as ``<arch>@sha256:...`` declared as ``name``."""
    from genshift.fsutil import sha256_bytes
    from genshift.identity import suggest, timm_name

    digest = sha256_bytes(f"{source}:{name}".encode())
    if source == "hf-hub":
        repo = suggest(name) if "/" in (suggest(name) or "") else f"timm/{timm_name(name)}"
        return {"id": repo, "source": source, "weights_revision": "e" * 40, "weights_sha256": None,
                "tensors_sha256": digest, "pretrained_cfg": {"hf_hub_id": repo}}
    arch = timm_name(name).split(".")[0]
    return {"id": f"{arch}@sha256:{digest[:16]}", "source": source, "architecture": arch,
            "declared_name": timm_name(name), "weights_revision": None,
            "weights_sha256": "f" * 64 if source == "checkpoint" else None, "tensors_sha256": digest}


def fake_result(model: str, configs: list[str], metrics: dict, *, suite_id: str = "s",
                metric_family: str = "imagenet_star", reference_config: str | None = "base") -> dict:
    """Passes ``genshift.eval.results.validate``; counts and predictions entries are placeholders (nothing
    reads them)."""
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "data_config": {}, "model": model_record(model),
            "suite": {"id": suite_id, "manifest_sha256": "0" * 64, "configs": list(configs),
                      "metric_family": metric_family, "pinned": True},
            "protocol": {"topk": 10, "limit_per_class": None, "skip_bad_images": False,
                         "scoring": ScoringOptions(reference_config=reference_config).to_dict()},
            "config_hash": "0" * 64, "run": {}, "environment": {},
            "started_at": "2026-01-01T00:00:00+00:00", "finished_at": "2026-01-01T00:00:00+00:00",
            "counts": {c: {"total": 1, "kept": 1, "predicted": 1, "skipped_bad": 0, "skipped_bad_ids": []}
                       for c in configs},
            "predictions": [{"config": c, "path": f"predictions/{c}.parquet", "rows": 1, "sha256": "0" * 64}
                            for c in configs],
            "flags": {"unpinned_suite": False, "construction_model": False, "partial": False,
                      "skipped_bad_images": False},
            "metrics": metrics}


def predictions(labels, true_ranks, *, pair_ids=None, true_probs=None, edit_types=None, prefix="img"):
    """A predictions table (``genshift.eval.predictions.schema``) from each image's label and the rank of the
    true class among the model's predictions (0 = top-1; >= 10: outside the stored top-10)."""
    import pyarrow as pa

    from genshift.eval.predictions import schema

    n = len(labels)
    topk, probs = [], []
    for y, r in zip(labels, true_ranks):
        others = [c for c in range(1000) if c != y][:10]
        row = others[:r] + [y] + others[r:9] if r < 10 else others
        topk.append(row[:10])
        probs.append([0.5 / (i + 1) for i in range(10)])
    cols = {"image_id": [f"{prefix}{i:04d}" for i in range(n)], "label": list(labels), "keep": [True] * n,
            "pair_id": list(pair_ids) if pair_ids is not None else [None] * n, "topk_idx": topk, "topk_prob": probs,
            "true_prob": list(true_probs) if true_probs is not None else [0.0] * n,
            "true_rank": [int(r) for r in true_ranks]}
    carried = ()
    if edit_types is not None:
        cols["edit_type"], carried = list(edit_types), ("edit_type",)
    return pa.table(cols, schema=schema(carried=carried))


def scored_result(model: str, family: str, tables: dict, *, suite_id: str, input_size: int = 224,
                  preprocess: str = "timm", reference_config: str | None = None, reference_accuracy=None,
                  construction: bool = False, source: str = "hf-hub") -> dict:
    """A result whose metrics are computed by ``genshift.eval.scoring.score`` from hand-built predictions."""
    from genshift.eval.scoring import ScoringOptions, score

    opts = ScoringOptions(reference_config=reference_config, reference_accuracy=reference_accuracy, n_boot=50)
    r = fake_result(model, sorted(tables), score(family, tables, opts), suite_id=suite_id, metric_family=family,
                    reference_config=reference_config)
    r["protocol"]["scoring"] = opts.to_dict()
    r["protocol"]["preprocess"] = preprocess
    r["data_config"] = {"input_size": [3, input_size, input_size]}
    r["flags"]["construction_model"] = construction
    r["model"] = model_record(model, source)
    return r
