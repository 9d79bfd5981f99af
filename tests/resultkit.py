"""A schema-valid result record with made-up numbers, for tests of cross-model code (slope, shift impact)."""

from eval.results import KIND
from eval.scoring import ScoringOptions


def fake_result(model: str, configs: list[str], metrics: dict, *, suite_id: str = "s",
                metric_family: str = "imagenet_star", reference_config: str | None = "base") -> dict:
    """Passes ``eval.results.validate``; counts and predictions entries are placeholders (nothing reads them)."""
    return {"schema_version": 1, "kind": KIND, "data_config": {},
            "model": {"id": model, "source": "random", "weights_revision": None, "weights_sha256": None},
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
