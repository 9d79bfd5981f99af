"""``bench eval`` end to end: open + verify the suite, load the model, predict every config,
score, and write the result with full provenance.

Output layout (``--out``, default ``runs/``)::

    runs/<suite id>/<model slug>/result.json
    runs/<suite id>/<model slug>/predictions/<config>.parquet
    runs/<suite id>/<model slug>/.work/            checkpoints of an unfinished run (removed at the end)

A killed run resumes from its last flushed checkpoint; a finished run is a no-op unless ``force``.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import atomic_write_json, canonical_json, ensure_writable_dir, sha256_bytes, sha256_file
from benchmark.reader import LocalSuite
from eval.inference import InferenceOptions, check_device, predict_config
from eval.predictions import read_predictions
from eval.results import KIND, RESULT_FILE, SCHEMA_VERSION, config_hash, environment, load_result, write_result
from eval.scoring import ScoringOptions, score

log = logging.getLogger(__name__)
RUN_STATE = "run.json"


@dataclass(frozen=True)
class EvalRequest:
    """Everything ``bench eval`` was asked to do."""

    model: str
    suite: str
    configs: tuple[str, ...] | None = None
    revision: str | None = None
    checkpoint: str | None = None
    remap_by_order: bool = False
    checkpoint_weights: str = "model"   # "model" | "ema": which weights of a training checkpoint
    mask: str | None = None
    out: str = "runs"
    force: bool = False
    inference: InferenceOptions = field(default_factory=InferenceOptions)
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    notes: str = ""


@dataclass(frozen=True)
class SuiteInfo:
    suite: LocalSuite
    metric_family: str
    reference_config: str | None
    construction_models: tuple[str, ...]
    pinned: bool
    source: str  # what the user gave


def open_suite(text: str, *, revision: str | None = None, configs: tuple[str, ...] | None = None,
               mask: str | None = None) -> SuiteInfo:
    """A local suite folder, a registry id or a Hub repo id -> a verified ``LocalSuite`` + its spec."""
    from benchmark import hub
    from benchmark.suites import SUITES, get_suite

    suite = hub.open_suite(text, revision=revision, configs=list(configs) if configs else None, mask=mask)
    key = text if text in SUITES else suite.suite_id
    spec = get_suite(key) if key in SUITES else None
    family, reference = (spec.metric_family, spec.reference_config) if spec else _declared_scoring(suite)
    return SuiteInfo(
        suite=suite,
        metric_family=family,
        reference_config=reference,
        construction_models=spec.construction_models if spec else (),
        pinned=suite.pinned, source=text,
    )


def _declared_scoring(suite: LocalSuite) -> tuple[str, str | None]:
    """Metric family and reference config a suite outside the registry declares in its manifest's
    ``generator`` (``bench import-folder`` does for multi-shift folders); ``accuracy`` otherwise."""
    from benchmark.suites import METRIC_FAMILIES

    gen = suite.manifest.generator if isinstance(suite.manifest.generator, dict) else {}
    family, reference = gen.get("metric_family", "accuracy"), gen.get("reference_config")
    if family not in METRIC_FAMILIES or not (reference is None or (isinstance(reference, str) and reference in suite.manifest.configs)):
        raise IntegrityError(f"suite {suite.suite_id!r} declares metric family {str(family)[:40]!r} with reference "
                             f"config {str(reference)[:70]!r}; expected one of {', '.join(METRIC_FAMILIES)} and one "
                             "of its configs; fix or re-import the suite")
    return family, reference


def reopen_suite(result: dict, *, suite: str | None = None, mask: str | None = None,
                 configs: tuple[str, ...] | None = None) -> SuiteInfo:
    """The suite a result was made on (for ``bench verify --recheck`` and ``bench diagnose``).

    By default it is opened as recorded (source, revision and, for the upstream ImageNet*
    adapter, the mask file); ``suite`` / ``mask`` point elsewhere. The opened suite must have
    the result's manifest hash.
    """
    rec = result["suite"]
    rec_mask = rec.get("mask") or {}
    if mask is None and rec_mask:
        mask = rec_mask["path"]
        if not Path(mask).is_file():
            raise BenchError(f"the result was scored with the mask {mask} (sha256 {rec_mask['sha256'][:12]}…), which is "
                             "not there any more; pass the same file with --mask")
    if mask is not None and rec_mask and sha256_file(mask) != rec_mask["sha256"]:
        raise IntegrityError(f"mask {mask} is not the one the result was scored with (sha256 "
                             f"{rec_mask['sha256'][:12]}…); pass that file with --mask")
    src = suite or rec.get("source") or rec["id"]
    info = open_suite(src, revision=None if suite else rec.get("revision"), configs=configs, mask=mask)
    if info.suite.manifest.sha256 != rec["manifest_sha256"]:
        raise IntegrityError(f"suite {src!r} has manifest {info.suite.manifest.sha256[:12]}…, the result was made on "
                             f"{rec['manifest_sha256'][:12]}…; pass the right suite with --suite")
    return info


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "._-" else "--" for ch in text)


def evaluate(req: EvalRequest, *, progress: bool = True) -> tuple[dict, Path]:
    """Run (or resume) an evaluation and return ``(result, result_path)``."""
    from eval.models import load_classifier, parse_model_name

    device = check_device(req.inference.device)
    if req.inference.amp and not device.startswith("cuda"):
        raise BenchError("--amp needs a CUDA device; drop --amp for CPU runs")
    parse_model_name(req.model)  # a typo in --model is reported before any suite download
    info = open_suite(req.suite, revision=req.revision, configs=req.configs, mask=req.mask)
    suite = info.suite
    configs = suite.select(list(req.configs) if req.configs else None)
    clf = load_classifier(req.model, checkpoint=req.checkpoint, device=device, remap_by_order=req.remap_by_order,
                          checkpoint_weights=req.checkpoint_weights)

    model_desc = clf.describe()
    suite_desc = {
        "id": suite.suite_id, "repo_id": suite.repo_id, "revision": suite.revision, "pinned": info.pinned,
        "manifest_sha256": suite.manifest.sha256, "suite_version": suite.manifest.suite_version,
        "configs": configs, "metric_family": info.metric_family, "source": info.source,
        "mask": {"path": str(Path(req.mask).resolve()), "sha256": sha256_file(req.mask)} if req.mask else None,
    }
    scoring = req.scoring
    if info.metric_family == "imagenet_star" and scoring.reference_config is None:
        scoring = ScoringOptions(**{**asdict(scoring), "reference_config": info.reference_config or "base"})
    protocol = {
        "topk": req.inference.topk, "limit_per_class": req.inference.limit_per_class,
        "skip_bad_images": req.inference.skip_bad_images, "scoring": scoring.to_dict(),
    }
    chash = config_hash(model_desc, suite_desc, protocol, clf.data_config)
    run_opts = {"device": device, "amp": req.inference.amp, "amp_dtype": req.inference.amp_dtype if req.inference.amp else None,
                "batch_size": req.inference.resolved_batch_size(), "channels_last": req.inference.channels_last,
                "compile": req.inference.compile, "workers": req.inference.resolved_workers(),
                "normalize_on_device": req.inference.device_normalizes()}
    # checkpoints are reusable only under the same protocol and numerics (device, AMP, batch composition)
    pred_key = sha256_bytes(canonical_json({"config_hash": chash, "amp": run_opts["amp"], "batch_size": run_opts["batch_size"],
                                            "unit_rows": req.inference.unit_rows,
                                            "normalize_on_device": run_opts["normalize_on_device"],
                                            "amp_dtype": run_opts["amp_dtype"], "device": device.split(":")[0]}))

    run_dir = ensure_writable_dir(Path(req.out) / _slug(suite.suite_id) / _slug(clf.model_id), what="--out directory")
    result_path = run_dir / RESULT_FILE
    if result_path.exists() and not req.force:
        try:
            old = load_result(result_path)
        except BenchError:
            old = None
        if old and old.get("config_hash") == chash and old.get("run", {}).get("predictions_key") == pred_key:
            log.info("already evaluated (%s); nothing to do (use --force to re-run)", result_path)
            return old, result_path
    _claim_run_dir(run_dir, pred_key, force=req.force)

    started = _now()
    counts, predictions, tables, timings = {}, [], {}, {}
    for config in configs:
        out_path = run_dir / "predictions" / f"{config}.parquet"
        stats = predict_config(suite, config, clf.model, clf.data_config, req.inference, work_dir=run_dir / ".work",
                               out_path=out_path, progress=progress)
        tables[config] = read_predictions(out_path)
        cinfo = suite.manifest.config(config)
        counts[config] = {"total": cinfo.rows, "kept": cinfo.kept, "predicted": stats.rows,
                          "skipped_bad": len(stats.skipped_bad), "skipped_bad_ids": stats.skipped_bad[:100]}
        predictions.append({"config": config, "path": f"predictions/{config}.parquet", "rows": stats.rows,
                            "sha256": sha256_file(out_path)})
        timings[config] = {"seconds": round(stats.seconds, 3), "model_seconds": round(stats.model_seconds, 3),
                           "images_per_second": round(stats.images_per_second, 3) if stats.rows else None,
                           "compiled": stats.compiled, "resumed_units": stats.resumed_units}
    metrics = score(info.metric_family, tables, scoring)
    analysis = {}
    if info.metric_family == "lance":
        from eval.lance_insight import result_clusters

        clusters = result_clusters(suite, tables, seed=scoring.seed)
        if clusters:
            analysis["lance_edit_clusters"] = clusters
    flags = {
        "unpinned_suite": not info.pinned,
        "construction_model": _is_construction_model(clf.model_id, info.construction_models),
        "partial": bool(req.inference.limit_per_class) or set(configs) != set(suite.configs),
        "skipped_bad_images": sum(c["skipped_bad"] for c in counts.values()) > 0,
    }
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "model": model_desc, "data_config": clf.data_config, "suite": suite_desc,
        "protocol": protocol, "config_hash": chash,
        "run": {**run_opts, "predictions_key": pred_key, "timings": timings},
        "environment": environment(), "started_at": started, "finished_at": _now(),
        "counts": counts, "metrics": metrics, "predictions": predictions, "flags": flags,
        "notes": req.notes,
        "analysis": analysis,
    }
    write_result(result_path, result)
    shutil.rmtree(run_dir / ".work", ignore_errors=True)
    return result, result_path


def _claim_run_dir(run_dir: Path, pred_key: str, *, force: bool) -> None:
    """Resume checkpoints made with the same predictions key; refuse to clobber other settings."""
    state_path = run_dir / RUN_STATE
    old = None
    if state_path.is_file():
        try:
            old = json.loads(state_path.read_text()).get("predictions_key")
        except ValueError:
            old = None
    has_outputs = any((run_dir / p).exists() for p in (RESULT_FILE, "predictions", ".work"))
    if old != pred_key and has_outputs:
        if not force:
            raise BenchError(f"{run_dir} holds a run of this model and suite with other settings; pass --force to "
                             "replace it or choose another --out")
    if force or old != pred_key:
        shutil.rmtree(run_dir / ".work", ignore_errors=True)
        shutil.rmtree(run_dir / "predictions", ignore_errors=True)
        (run_dir / RESULT_FILE).unlink(missing_ok=True)
    atomic_write_json(state_path, {"predictions_key": pred_key})


def _is_construction_model(model_id: str, construction: tuple[str, ...]) -> bool:
    name = model_id.split("/", 1)[1] if model_id.startswith("timm/") else model_id
    return any(name == c or model_id == c for c in construction)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
