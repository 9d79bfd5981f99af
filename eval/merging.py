"""Checkpointed predictions and building a model's result from the parts its processes wrote (any process of a
sweep, or ``bench eval --merge OUT`` after the fact). An unfinished run: ``<run>/.work/job.json``,
``session.json`` and ``<config>/part-<first>-<last>.parquet`` + ``.json`` sidecars, one per contiguous run of units.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import FileLock

from genshift.errors import BenchError, IntegrityError, one_line
from genshift.eval.predictions import PredictionBlock, schema
from genshift.eval.results import KIND, RESULT_FILE, SCHEMA_VERSION, environment, write_result
from genshift.eval.scoring import ScoringOptions, score
from genshift.eval.suite_trust import open_suite
from genshift.families import get_family
from genshift.fsutil import INCOMPLETE, atomic_path, atomic_write_bytes, canonical_json, read_json, sha256_bytes

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


# Names that become path components under an output folder (suite configs): one strict pattern.
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PART_NAME = re.compile(r"^part-(\d{7})-(\d{7})\.parquet$")


def part_range(part: Path, n_units: int | None = None) -> tuple[int, int]:
    """``(first, last)`` unit of a part file from its name, checked against the run's unit count
    before anything is built from it (a name cannot make a huge range)."""
    m = PART_NAME.match(part.name)
    if not m:
        raise IntegrityError(f"checkpoint {str(part)!r}: not a part name (part-NNNNNNN-NNNNNNN.parquet); it was not "
                             "written by bench eval, remove it or rerun with --force")
    first, last = int(m.group(1)), int(m.group(2))
    if first > last or (n_units is not None and last >= n_units):
        raise IntegrityError(f"checkpoint {str(part)!r}: units {first}..{last} are not inside this run's "
                             f"0..{(n_units or 0) - 1}; it was not written by this run, remove it or rerun with "
                             "--force")
    return first, last


def done_units(config_dir: Path, n_units: int | None = None) -> set[int]:
    """Units with a part in ``config_dir``, from the part names (bounded by the unit count); what the
    parts hold is checked when they are merged."""
    done: set[int] = set()
    for part in sorted(config_dir.glob("part-*.parquet")) if config_dir.is_dir() else ():
        first, last = part_range(part, n_units)
        done.update(range(first, last + 1))
    return done


def unit_digest(image_ids) -> str:
    """What a unit holds, independent of order: sha256 over its sorted image ids (16 hex)."""
    return sha256_bytes("\n".join(sorted(image_ids)).encode("utf-8"))[:16]


def contained(path: Path, root: Path) -> Path:
    """``path`` resolved, asserted to lie strictly inside ``root`` (nothing outside ``--out`` is
    ever written or removed, whatever names a suite's manifest carries)."""
    full, base = Path(path).resolve(), Path(root).resolve()
    if full == base or base not in full.parents:
        raise IntegrityError(f"refusing to touch {str(path)!r}: it is not inside {str(root)!r}")
    return full


def check_config_name(config: str) -> str:
    if not isinstance(config, str) or not SAFE_NAME.match(config) or ".." in config:
        raise IntegrityError(f"config name {config!r} cannot be used as a file or folder name (letters, digits, "
                             "'.', '_', '-' only); fix the suite's manifest")
    return config


def safe_config_dir(work_dir: Path, config: str) -> Path:
    return contained(Path(work_dir) / check_config_name(config), work_dir)


class CheckpointedPredictions:
    """Collect prediction blocks for one config, flushing parts atomically every
    ``flush_rows`` rows and every ``flush_seconds`` so a killed run resumes (``done_units``: what to skip);
    ``finish`` merges every process's parts, sorted by ``image_id``, into the final file."""

    def __init__(self, work_dir: Path, config: str, sch: pa.Schema, *, flush_rows: int = 2048,
                 flush_seconds: float = 30.0, session: str = "", rank: int = 0, run_key: str = "",
                 n_units: int | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.dir = safe_config_dir(self.work_dir, config)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema, self.flush_rows, self.flush_seconds = sch, flush_rows, flush_seconds
        self.session, self.rank, self.run_key, self.n_units = session, rank, run_key, n_units
        self._pending: list[tuple[int, pa.Table, list[str]]] = []  # (unit, its rows, its skipped image ids)
        self._timings = {"model_seconds": 0.0}
        self._last_flush = time.monotonic()
        self.batch_size: int | None = None
        self.done_units = done_units(self.dir, n_units)  # from any process or an earlier run

    def add(self, unit: int, block: PredictionBlock, *, skipped_bad: list[str] = (), model_seconds: float = 0.0,
            threads_used: int = 1) -> None:
        self._pending.append((unit, block.to_table(self.schema), list(skipped_bad)))
        self._timings["model_seconds"] += model_seconds
        # how many threads had run this model's batches so far: the evidence that --forward-threads ran
        self._timings["forward_threads_used"] = max(self._timings.get("forward_threads_used", 0), threads_used)
        if (sum(t.num_rows for _, t, _ in self._pending) >= self.flush_rows
                or time.monotonic() - self._last_flush >= self.flush_seconds):
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        units = [u for u, _, _ in self._pending]
        if units != sorted(units) or len(set(units)) != len(units):
            raise RuntimeError(f"units flushed out of order: {units}")
        now = time.monotonic()
        timings = {**self._timings, "seconds": round(now - self._last_flush, 3)}
        # one part per contiguous run of units (a process of a distributed sweep holds scattered units);
        # the flush's timings go in the first part's sidecar; rows and skipped images are per unit, so a
        # merge can check every part against the units it names (inspect_parts)
        starts = [i for i, u in enumerate(units) if i == 0 or u != units[i - 1] + 1]
        for first, end in zip(starts, [*starts[1:], len(units)]):
            run = self._pending[first:end]
            name = f"part-{run[0][0]:07d}-{run[-1][0]:07d}"
            skipped = [s for _, _, s in run]
            info = {**timings, "units": [u for u, _, _ in run], "batch_size": self.batch_size, "session": self.session,
                    "rank": self.rank, "run_key": self.run_key, "rows_per_unit": [t.num_rows for _, t, _ in run],
                    "skipped_per_unit": skipped, "skipped_bad": [x for s in skipped for x in s]}
            atomic_write_bytes(self.dir / f"{name}.json", canonical_json(info))
            with atomic_path(self.dir / f"{name}.parquet") as tmp:
                pq.write_table(pa.concat_tables([t for _, t, _ in run]), tmp)
            timings = {"model_seconds": 0.0, "seconds": 0.0}
        self.done_units.update(units)
        self._pending, self._timings, self._last_flush = [], {"model_seconds": 0.0}, now

    def finish(self, out_path: Path) -> int:
        """Merge all parts into ``out_path`` (sorted by image_id); returns the row count."""
        parts_dir = contained(self.dir, self.work_dir)  # never remove anything outside the run's work folder
        self.flush()
        parts = sorted(self.dir.glob("part-*.parquet"))
        table = pa.concat_tables([pq.read_table(p) for p in parts]) if parts else self.schema.empty_table()
        # one chunk whatever the part layout, so the file's bytes do not depend on how units were split
        table = table.take(pc.sort_indices(table, [("image_id", "ascending")])).combine_chunks()
        with atomic_path(out_path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        shutil.rmtree(parts_dir)
        return table.num_rows


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
        with FileLock(run_dir / ".lock"):  # across processes
            if (run_dir / WORK / JOB_FILE).is_file():
                done.append((run_dir / RESULT_FILE, finish_run(run_dir, out)))
    return done


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
