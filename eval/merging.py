"""Building a model's result from the parts its processes wrote (any process of a sweep, or
``bench eval --merge OUT`` after the fact). An unfinished run: ``<run>/.work/job.json``, ``session.json``
and ``<config>/part-<first>-<last>.parquet`` + ``.json`` sidecars, one per contiguous run of units.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock

from genshift.errors import BenchError, IntegrityError, one_line
from genshift.eval.predictions import (
    CheckpointedPredictions,
    check_config_name,
    contained,
    part_range,
    safe_config_dir,
    schema,
    unit_digest,
)
from genshift.eval.results import KIND, RESULT_FILE, SCHEMA_VERSION, environment, write_result
from genshift.eval.scoring import ScoringOptions, score
from genshift.eval.suite_trust import open_suite
from genshift.families import get_family
from genshift.fsutil import INCOMPLETE, read_json, sha256_bytes

JOB_FILE = "job.json"          # in .work/: everything needed to build the result from the parts
WORK = ".work"
MAX_JOB_BYTES = 64 << 20       # job.json holds one digest per unit: ~20 bytes a unit
MAX_SIDECAR_BYTES = 16 << 20
MAX_UNITS = 1_000_000           # per config (a unit is >= 1 batch of rows)
# every key of job.json read here, with its type: a job file from elsewhere fails with one line
JOB_KEYS = {"model": dict, "data_config": dict, "suite": dict, "protocol": dict, "config_hash": str, "run": dict,
            "scoring": dict, "metric_family": str, "construction_model": bool, "partial": bool, "units": dict,
            "unit_ids": dict, "counts": dict, "carried": list, "topk": int, "notes": str, "started_at": str,
            "reopen": dict, "compile": bool, "group": str}


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def refuse_links(path: Path, out: Path) -> Path:
    """``path`` inside ``out`` with no symbolic link on the way (a ``.work`` linked to another run
    would otherwise get that run's parts merged and removed); returns it resolved."""
    p, out = Path(path), Path(out)
    for step in (*reversed(p.parents), p):
        if step != out and step.is_relative_to(out) and step.is_symlink():
            raise IntegrityError(f"{str(step)!r} is a symbolic link; bench eval never writes one, so it did not "
                                 "write this run: remove the link (nothing was merged or removed)")
    return contained(p, out)


def read_job(run_dir: Path) -> dict:
    """``.work/job.json`` read with a size limit and every key the merge uses checked for type."""
    where = f"{run_dir}/{WORK}/{JOB_FILE}"
    if not (run_dir / WORK / JOB_FILE).is_file():
        raise IntegrityError(f"{run_dir} has no {WORK}/{JOB_FILE}; it is not an unfinished bench eval run")
    state = read_json(run_dir / WORK / JOB_FILE, max_bytes=MAX_JOB_BYTES, what="job file", where=where)

    def bad(what: str) -> IntegrityError:
        return IntegrityError(f"{where}: {what}; it was not written by this version of bench eval (rerun the "
                              "sweep with --force)")

    if not isinstance(state, dict):
        raise bad("not a JSON object")
    for key, typ in JOB_KEYS.items():
        if key not in state:
            raise bad(f"key {key!r} is missing")
        if not _is(state[key], typ):
            raise bad(f"key {key!r} is not a {typ.__name__}")
    configs = state["suite"].get("configs")
    if not isinstance(configs, list) or not configs or set(configs) != set(state["units"]):
        raise bad("suite.configs and units name different configs")
    for config, n in state["units"].items():
        check_config_name(config)
        if not _is(n, int) or not 0 <= n <= MAX_UNITS:
            raise bad(f"units of config {config!r} is not a whole number in 0..{MAX_UNITS}")
        ids = state["unit_ids"].get(config)
        if not isinstance(ids, list) or len(ids) != n or not all(isinstance(x, str) for x in ids):
            raise bad(f"unit_ids of config {config!r} is not a list of {n} digests")
        if not isinstance(state["counts"].get(config), dict):
            raise bad(f"counts of config {config!r} is missing")
    if not isinstance(state["run"].get("predictions_key"), str):
        raise bad("run.predictions_key is missing")
    if not 1 <= state["topk"] <= 1000 or not all(isinstance(c, str) for c in state["carried"]):
        raise bad("topk or carried columns are out of range")
    return state


def _is(value, typ: type) -> bool:
    """``isinstance`` as JSON means it: a bool is not a number."""
    return isinstance(value, typ) and not (typ is int and isinstance(value, bool))


def inspect_parts(run_dir: Path, state: dict, out: Path) -> tuple[dict[str, list[dict]], dict[str, list[int]]]:
    """Check what every part of the run holds, not only its name: its sidecar belongs to this run
    (run key: model, suite, protocol and numerics), the units its name gives are the sidecar's,
    its rows are exactly those units' images (per-unit digests of the job), no two parts share a
    unit, and the schema is the run's. Returns the parts' sidecars per config and the units still
    missing; anything else is one ``IntegrityError`` naming the part. Reads only."""
    work = refuse_links(run_dir / WORK, out)
    sch = schema(state["topk"], tuple(state["carried"]))
    key = state["run"]["predictions_key"]
    infos: dict[str, list[dict]] = {}
    missing: dict[str, list[int]] = {}
    for config in state["suite"]["configs"]:
        n = state["units"][config]
        d = refuse_links(safe_config_dir(work, config), out)
        owner: dict[int, str] = {}
        infos[config] = []
        for part in sorted(d.glob("part-*.parquet")) if d.is_dir() else ():
            name = f"{run_dir.name}/{WORK}/{config}/{part.name}"
            if part.is_symlink():
                raise IntegrityError(f"part {name} is a symbolic link; remove it (nothing was merged or removed)")
            first, last = part_range(part, n)
            side = part.with_suffix(".json")
            if not side.is_file() or side.is_symlink():
                raise IntegrityError(f"part {name} has no sidecar {side.name}; it was not written by bench eval, "
                                     "remove it")
            info = read_json(side, max_bytes=MAX_SIDECAR_BYTES, what="part sidecar", where=name, max_depth=8)
            if not isinstance(info, dict):
                raise IntegrityError(f"part {name}: its sidecar is not a JSON object; remove the part")
            units = list(range(first, last + 1))
            if info.get("run_key") != key:
                raise IntegrityError(f"part {name} was written by another run (other model, suite, settings or "
                                     "numerics); remove it or rerun with --force")
            if info.get("units") != units:
                raise IntegrityError(f"part {name}: its sidecar lists other units than its name; remove it")
            for u in units:
                if u in owner:
                    raise IntegrityError(f"part {name} overlaps part {owner[u]} (unit {u}); remove one of them")
                owner[u] = part.name
            _check_rows(part, name, info, units, sch, state["unit_ids"][config])
            infos[config].append(info)
        miss = [u for u in range(n) if u not in owner]
        if miss:
            missing[config] = miss
    return infos, missing


def _check_rows(part: Path, name: str, info: dict, units: list[int], sch, digests: list[str]) -> None:
    rows, skipped = info.get("rows_per_unit"), info.get("skipped_per_unit")
    if (not isinstance(rows, list) or not isinstance(skipped, list) or len(rows) != len(units)
            or len(skipped) != len(units) or not all(isinstance(r, int) and r >= 0 for r in rows)
            or not all(isinstance(s, list) and all(isinstance(x, str) for x in s) for s in skipped)):
        raise IntegrityError(f"part {name}: its sidecar does not give rows per unit; remove the part")
    try:
        if pq.read_schema(part) != sch:
            raise IntegrityError(f"part {name} has another schema than this run's predictions; remove it")
        ids = pq.read_table(part, columns=["image_id"])["image_id"].to_pylist()
    except (OSError, pa.ArrowException) as e:
        raise IntegrityError(f"part {name} is not readable parquet ({one_line(e, limit=200)}); remove it") from None
    if len(ids) != sum(rows):
        raise IntegrityError(f"part {name} holds {len(ids)} rows, its units have {sum(rows)}; remove it")
    for u, r, s, at in zip(units, rows, skipped, accumulate(rows, initial=0)):
        if unit_digest(ids[at:at + r] + s) != digests[u]:
            raise IntegrityError(f"part {name}: the rows of unit {u} are not that unit's images; remove the part")


def missing_units(run_dir: Path, out: Path) -> dict[str, list[int]]:
    return inspect_parts(run_dir, read_job(run_dir), out)[1]


def describe_missing(missing: dict[str, list[int]]) -> str:
    more = {c: f" … ({len(units)} in all)" if len(units) > 8 else "" for c, units in missing.items()}
    return "; ".join(f"config {c}: unit(s) {', '.join(map(str, units[:8]))}{more[c]}" for c, units in missing.items())


def finish_run(run_dir: Path, out: Path, *, suite=None) -> dict:
    """Merge a model's parts into its predictions files, score, and write its result; every part is
    checked (``inspect_parts``) before anything is written or removed."""
    work = run_dir / WORK
    state = read_job(run_dir)
    parts, missing = inspect_parts(run_dir, state, out)
    if missing:
        raise BenchError(f"{run_dir.name}: units missing ({describe_missing(missing)}); rerun the sweep to fill them")
    session = read_state(work / "session.json").get("session")
    sch = schema(state["topk"], tuple(state["carried"]))
    counts, predictions, tables, timings, eff_batch = {}, [], {}, {}, []
    for config in state["suite"]["configs"]:
        infos = parts[config]
        out_path = contained(run_dir / "predictions" / f"{config}.parquet", out)
        rows = CheckpointedPredictions(work, config, sch, n_units=state["units"][config]).finish(out_path)
        data = out_path.read_bytes()  # one read: the table scored and the sha256 recorded are of the same bytes
        tables[config] = pq.read_table(pa.BufferReader(data))
        skipped = [i for info in infos for i in info.get("skipped_bad", [])]
        counts[config] = {**state["counts"][config], "predicted": rows, "skipped_bad": len(skipped),
                          "skipped_bad_ids": sorted(skipped)[:100]}
        predictions.append({"config": config, "path": f"predictions/{config}.parquet", "rows": rows,
                            "sha256": sha256_bytes(data)})
        seconds = sum(i.get("seconds", 0.0) for i in infos)
        sizes = [i["batch_size"] for i in infos if i.get("batch_size")]
        eff_batch += sizes
        by_rank = Counter()  # which process wrote how many units: the evidence that a split run was split
        for i in infos:
            by_rank[str(i.get("rank", 0))] += len(i.get("units", []))
        timings[config] = {"seconds": round(seconds, 3),
                           "model_seconds": round(sum(i.get("model_seconds", 0.0) for i in infos), 3),
                           # threads that ran batches (per process; model_seconds sums over them)
                           "forward_threads_used": max((i.get("forward_threads_used", 0) for i in infos), default=0),
                           "images_per_second": round(rows / seconds, 3) if rows and seconds > 0 else None,
                           "compiled": state["compile"],
                           "resumed_units": sum(len(i.get("units", [])) for i in infos if i.get("session") != session),
                           "effective_batch_size": min(sizes) if sizes else None,
                           "units_by_rank": dict(sorted(by_rank.items()))}
    scoring = ScoringOptions(**state["scoring"])
    metrics = score(state["metric_family"], tables, scoring)
    family = get_family(state["metric_family"])
    analysis = {}
    if family.analysis is not None:  # LANCE: Fig. 6's clusters of text edits (genshift.eval.diagnose.result_clusters)
        if suite is None:
            r = state["reopen"]
            suite = open_suite(r["suite"], revision=r["revision"], configs=tuple(r["configs"]), mask=r["mask"]).suite
        analysis = family.resolve(family.analysis)(suite, tables, seed=scoring.seed) or {}
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
        # the settings the forward passes ran with, not this process's (a merge runs elsewhere)
        "environment": {**environment(), **state.get("ran", {})},
        "started_at": state["started_at"], "finished_at": now(),
        "counts": counts, "metrics": metrics, "predictions": predictions, "flags": flags,
        "notes": state["notes"], "analysis": analysis,
    }
    write_result(run_dir / RESULT_FILE, result)
    shutil.rmtree(refuse_links(work, out))
    return result


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
    for run_dir in runs:  # every run checked before any is built: a bad part stops the merge, nothing removed
        refuse_links(run_dir, out)
        miss = missing_units(run_dir, out)
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


def locked(path: Path):
    """An exclusive lock across processes on ``path`` (filelock's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path))


def clean_leftovers(run_dir: Path, out: Path, *, work_too: bool) -> None:
    """Temp files of killed runs (``*.incomplete``) inside this run folder; with ``work_too`` also a
    stale ``.work`` (a run killed between writing its result and removing its checkpoints)."""
    if not run_dir.is_dir():
        return
    for p in run_dir.rglob(f"*{INCOMPLETE}"):
        if p.is_file() and not p.is_symlink():
            refuse_links(p, out).unlink(missing_ok=True)
    if work_too and (run_dir / WORK).is_dir():
        shutil.rmtree(refuse_links(run_dir / WORK, out))


def read_state(path: Path) -> dict:
    """A state file of ours (``run.json``, ``session.json``) through the one untrusted-JSON parser;
    ``{}`` when it is absent or not a JSON object."""
    try:
        state = read_json(path, max_bytes=MAX_SIDECAR_BYTES, what="run state")
    except BenchError:
        return {}
    return state if isinstance(state, dict) else {}
