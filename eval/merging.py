"""Building a model's result from the parts its processes wrote (any process of a sweep, or
``bench eval --merge OUT`` after the fact).

Layout of an unfinished run: ``<run>/.work/job.json`` (everything needed to build the result),
``<run>/.work/session.json`` and ``<run>/.work/<config>/part-<first>-<last>.parquet`` + ``.json``
sidecars, one per contiguous run of streaming units.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from benchmark.errors import BenchError, IntegrityError
from benchmark.fsutil import sha256_file
from eval.predictions import CheckpointedPredictions, contained, read_predictions, safe_config_dir, schema
from eval.results import KIND, RESULT_FILE, SCHEMA_VERSION, environment, write_result
from eval.scoring import ScoringOptions, score
from eval.suite_open import open_suite

JOB_FILE = "job.json"          # in .work/: everything needed to build the result from the parts
WORK = ".work"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def done_units(work: Path, config: str) -> set[int]:
    d = work / config
    done: set[int] = set()
    for part in d.glob("part-*.parquet") if d.is_dir() else ():
        try:
            first, last = (int(x) for x in part.stem.split("-")[1:3])
        except ValueError:
            continue
        done.update(range(first, last + 1))
    return done


def missing_units(run_dir: Path) -> dict[str, list[int]]:
    state = read_json(run_dir / WORK / JOB_FILE, None)
    if state is None:
        raise IntegrityError(f"{run_dir} has no {WORK}/{JOB_FILE}; it is not an unfinished bench eval run")
    out = {}
    for config, n in state["units"].items():
        safe_config_dir(run_dir / WORK, config)
        miss = sorted(set(range(n)) - done_units(run_dir / WORK, config))
        if miss:
            out[config] = miss
    return out


def describe_missing(missing: dict[str, list[int]]) -> str:
    parts = []
    for c, units in missing.items():
        shown = ", ".join(map(str, units[:8])) + (f" … ({len(units)} in all)" if len(units) > 8 else "")
        parts.append(f"config {c}: unit(s) {shown}")
    return "; ".join(parts)


def finish_run(run_dir: Path, out: Path, *, suite=None) -> dict:
    """Merge a model's parts into its predictions files, score, and write its result."""
    work = run_dir / WORK
    state = read_json(work / JOB_FILE, None)
    session = read_json(work / "session.json", {}).get("session")
    sch = schema(state["topk"], tuple(state["carried"]))
    counts, predictions, tables, timings = {}, [], {}, {}
    eff_batch = []
    for config in state["suite"]["configs"]:
        ckpt = CheckpointedPredictions(work, config, sch)
        infos = ckpt.part_info()
        out_path = contained(run_dir / "predictions" / f"{config}.parquet", out)
        rows = ckpt.finish(out_path)
        tables[config] = read_predictions(out_path)
        skipped = [i for info in infos for i in info.get("skipped_bad", [])]
        counts[config] = {**state["counts"][config], "predicted": rows, "skipped_bad": len(skipped),
                          "skipped_bad_ids": sorted(skipped)[:100]}
        predictions.append({"config": config, "path": f"predictions/{config}.parquet", "rows": rows,
                            "sha256": sha256_file(out_path)})
        seconds = sum(i.get("seconds", 0.0) for i in infos)
        sizes = [i["batch_size"] for i in infos if i.get("batch_size")]
        eff_batch += sizes
        timings[config] = {"seconds": round(seconds, 3),
                           "model_seconds": round(sum(i.get("model_seconds", 0.0) for i in infos), 3),
                           "images_per_second": round(rows / seconds, 3) if rows and seconds > 0 else None,
                           "compiled": state["compile"],
                           "resumed_units": sum(len(i.get("units", [])) for i in infos if i.get("session") != session),
                           "effective_batch_size": min(sizes) if sizes else None,
                           # which process wrote how many units: the evidence that a split run was split
                           "units_by_rank": _units_by_rank(infos)}
    scoring = ScoringOptions(**state["scoring"])
    metrics = score(state["metric_family"], tables, scoring)
    analysis = {}
    if state["metric_family"] == "lance":
        from eval.lance_insight import result_clusters

        if suite is None:
            r = state["reopen"]
            suite = open_suite(r["suite"], revision=r["revision"], configs=tuple(r["configs"]), mask=r["mask"]).suite
        clusters = result_clusters(suite, tables, seed=scoring.seed)
        if clusters:
            analysis["lance_edit_clusters"] = clusters
    flags = {
        "unpinned_suite": not state["suite"]["pinned"], "construction_model": state["construction_model"],
        "partial": state["partial"],
        "skipped_bad_images": sum(c["skipped_bad"] for c in counts.values()) > 0,
    }
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND,
        "model": state["model"], "data_config": state["data_config"], "suite": state["suite"],
        "protocol": state["protocol"], "config_hash": state["config_hash"],
        "run": {**state["run"], "timings": timings, "effective_batch_size": min(eff_batch) if eff_batch else None},
        "environment": environment(), "started_at": state["started_at"], "finished_at": now(),
        "counts": counts, "metrics": metrics, "predictions": predictions, "flags": flags,
        "notes": state["notes"], "analysis": analysis,
    }
    write_result(run_dir / RESULT_FILE, result)
    shutil.rmtree(contained(work, out))
    return result


def _units_by_rank(infos: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in infos:
        key = str(i.get("rank", 0))
        out[key] = out.get(key, 0) + len(i.get("units", []))
    return dict(sorted(out.items()))


def merge(out: str | os.PathLike) -> list[tuple[Path, dict]]:
    """``bench eval --merge OUT``: build the result of every run under ``OUT`` whose units are all
    there; a run with missing units is an error that names them."""
    out = Path(out)
    if not out.is_dir():
        raise BenchError(f"--merge {str(out)!r} is not a folder; give the --out of the sweep")
    runs = sorted(p.parent.parent for p in out.glob(f"*/*/{WORK}/{JOB_FILE}"))
    if not runs:
        raise BenchError(f"nothing to merge under {str(out)!r}: no unfinished run (no */*/{WORK}/{JOB_FILE})")
    problems = []
    for run_dir in runs:
        contained(run_dir, out)
        miss = missing_units(run_dir)
        if miss:
            problems.append(f"{run_dir.relative_to(out)}: {describe_missing(miss)}")
    if problems:
        raise BenchError("cannot merge, units missing: " + " | ".join(problems) + "; rerun the sweep to fill them")
    done = []
    for run_dir in runs:
        with locked(run_dir / ".lock"):
            if (run_dir / WORK / JOB_FILE).is_file():
                done.append((run_dir / RESULT_FILE, finish_run(run_dir, out)))
    return done


@contextlib.contextmanager
def locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_json(path: Path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default
