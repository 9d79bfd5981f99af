"""Many models, one decode: ``bench eval`` over a model list, in one or many processes.

A sweep scores every model of a list on one suite and writes, for each model, exactly the
``result.json`` and ``predictions/<config>.parquet`` a single ``bench eval`` of that model
writes (a single ``bench eval`` *is* a sweep of one model), so the results store, ``bench
verify`` and ``bench submit`` need no change.

How the work is shared:

- **Preprocessing groups.** Models are grouped by their resolved data config (input size, crop,
  interpolation, and mean/std unless the device normalises); each streaming unit of a config is
  decoded and transformed once per group and fed to every model of the group. At most
  ``max_resident`` models are loaded at once (a larger group is processed in chunks).
- **Work items** are ``(chunk, config, unit)`` with cost = models still needing the unit x rows.
  Under ``accelerate launch`` (or torchrun) they are split across processes by a deterministic
  greedy balance of cost (largest first onto the least-loaded process). Each process writes its
  units atomically into each model's ``.work/<config>/`` folder.
- **Merging.** Whichever process finds a model's units complete builds its predictions files and
  result (under a file lock, so two finishing together do not collide); ``bench eval --merge
  OUT`` does the same for an output folder after the fact and names missing units.
- **Resume.** Units flushed by rows and by time survive a kill; a rerun skips them, skips models
  already finished, and cleans temp files left by killed runs. Predictions files are sorted by
  ``image_id`` and written from one chunk, so their bytes do not depend on the process count or
  on where a run was interrupted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from benchmark import upstream
from benchmark.errors import BenchError, IntegrityError, one_line
from benchmark.fsutil import INCOMPLETE, atomic_write_json, canonical_json, ensure_writable_dir, sha256_bytes, sha256_file
from benchmark.oom import BatchBackoff
from eval.inference import (
    Forward, InferenceOptions, ModelFeed, check_device, plan_units, predict_units, wants_compile,
)
from eval.predictions import (
    CARRIED_COLUMNS, CheckpointedPredictions, check_config_name, contained, read_predictions, safe_config_dir, schema,
)
from eval.results import KIND, RESULT_FILE, SCHEMA_VERSION, config_hash, environment, load_result, write_result
from eval.runner import _is_construction_model, _slug, open_suite
from eval.scoring import ScoringOptions, score

log = logging.getLogger(__name__)
RUN_STATE = "run.json"
JOB_FILE = "job.json"          # in .work/: everything needed to build the result from the parts
FAILURE_FILE = "failure.json"  # a model that failed in a sweep: the error, for the summary
WORK = ".work"
WILDCARD_CHARS = "*?["
MAX_MODELS = 5000


@dataclass(frozen=True)
class ModelSpec:
    """One model of a sweep: a name (as ``--model`` takes it) and optional local weights."""

    name: str
    checkpoint: str | None = None
    from_wildcard: str | None = None  # the pattern it was expanded from


@dataclass(frozen=True)
class SweepRequest:
    models: tuple[ModelSpec, ...]
    suite: str
    configs: tuple[str, ...] | None = None
    revision: str | None = None
    remap_by_order: bool = False
    checkpoint_weights: str = "model"  # "model" | "ema": which weights of a training checkpoint
    preprocess: str = "timm"           # eval.models.PREPROCESS
    mask: str | None = None
    out: str = "runs"
    force: bool = False
    inference: InferenceOptions = field(default_factory=InferenceOptions)
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    notes: str = ""
    max_resident: int = 4
    pretrained: bool = True       # False: random weights (benchmarks); never from the CLI
    wildcards: dict = field(default_factory=dict)  # pattern -> expansion, recorded in each result


# --------------------------------------------------------------------------------------------
# model lists


def is_wildcard(name: str) -> bool:
    return any(c in name for c in WILDCARD_CHARS)


def expand_wildcard(pattern: str) -> list[str]:
    """timm's ``list_pretrained`` for a pattern, 1000-class ImageNet heads only."""
    import timm
    from timm.models import get_pretrained_cfg

    prefix = "timm/" if pattern.startswith("timm/") else ""
    body = pattern[len(prefix):]
    if "/" in body or "@" in body or body.startswith("hf-hub:"):
        raise BenchError(f"wildcard {pattern!r}: only timm registry names can be expanded (e.g. "
                         "'timm/convnext_*.fb_in1k'); list Hub repos one by one")
    names = timm.list_pretrained(body)
    if not names:
        raise BenchError(f"wildcard {pattern!r} matches no timm pretrained model; check the pattern with "
                         "python -c \"import timm; print(timm.list_pretrained('...'))\"")
    keep = [n for n in names if getattr(get_pretrained_cfg(n), "num_classes", None) == 1000]
    if not keep:
        raise BenchError(f"wildcard {pattern!r} matches {len(names)} model(s) (e.g. {names[0]!r}) but none has a "
                         "1000-class ImageNet head; bench scores ImageNet-1k classifiers only (try an *_in1k tag)")
    return sorted(prefix + n for n in keep)


def parse_models_file(path: str | os.PathLike) -> list[ModelSpec]:
    """``--models FILE``: one model per line, optionally followed by whitespace and a checkpoint path
    (relative paths are taken from the file's folder); ``#`` starts a comment."""
    p = Path(path)
    try:
        if p.stat().st_size > 1 << 20:
            raise BenchError(f"--models file {str(p)!r} is over 1 MiB; is it the right file?")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BenchError(f"--models file {str(p)!r} does not exist") from None
    except UnicodeDecodeError:
        raise BenchError(f"--models file {str(p)!r} is not UTF-8 text") from None
    except OSError as e:
        raise BenchError(f"cannot read --models file {str(p)!r} ({e.strerror})") from None
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise BenchError(f"--models file {p.name} line {n}: expected 'MODEL [CHECKPOINT]', got {line!r}")
        ck = None
        if len(parts) == 2:  # a relative checkpoint path is relative to the list file, not the working directory
            ck = parts[1] if os.path.isabs(parts[1]) else str(p.parent / parts[1])
        out.append(ModelSpec(parts[0], ck))
    return out


def resolve_models(models: list[str] | None, *, models_file: str | None = None,
                   checkpoint: str | None = None) -> tuple[list[ModelSpec], dict[str, list[str]]]:
    """The sweep's model list from ``--model`` (repeatable; ``NAME=CHECKPOINT``; timm wildcards) and
    ``--models FILE``. Every name is checked (timm's close matches for unknown ones) before any
    data is touched. Returns the specs and the wildcard expansions."""
    from eval.models import parse_model_name

    raw: list[ModelSpec] = []
    for m in models or []:
        name, sep, ck = m.partition("=")
        if sep and not ck:
            raise BenchError(f"--model {m!r}: NAME=CHECKPOINT needs a checkpoint path after '='")
        raw.append(ModelSpec(name.strip(), ck or None))
    if models_file:
        listed = parse_models_file(models_file)
        if not listed:
            raise BenchError(f"--models file {models_file!r} lists no model (only blank or # comment lines)")
        raw += listed
    if not raw:
        raise BenchError("no model given; pass --model NAME (repeatable) or --models FILE")
    if checkpoint is not None:
        if len(raw) != 1 or is_wildcard(raw[0].name):
            raise BenchError("--checkpoint applies to one model; with several models give each its weights as "
                             "--model NAME=CHECKPOINT or on its line of --models FILE")
        if raw[0].checkpoint:
            raise BenchError(f"model {raw[0].name!r} has a checkpoint twice (NAME=PATH and --checkpoint); give one")
        raw = [replace(raw[0], checkpoint=checkpoint)]
    specs: list[ModelSpec] = []
    expansions: dict[str, list[str]] = {}
    for spec in raw:
        if is_wildcard(spec.name):
            if spec.checkpoint:
                raise BenchError(f"wildcard {spec.name!r} cannot take a checkpoint; list the models one by one")
            names = expand_wildcard(spec.name)
            expansions[spec.name] = names
            specs += [ModelSpec(n, None, spec.name) for n in names]
        else:
            specs.append(spec)
    if len(specs) > MAX_MODELS:
        raise BenchError(f"{len(specs)} models in one sweep (limit {MAX_MODELS}); split the list")
    seen: dict[str, str] = {}
    for spec in specs:
        ref = parse_model_name(spec.name)  # unknown names fail here, with timm's close matches
        key = _canonical_id(ref, spec.checkpoint)
        if key in seen:
            raise BenchError(f"model {key!r} is listed twice (as {seen[key]!r} and {spec.name!r}); "
                             "each model is scored once per sweep, remove the duplicate")
        seen[key] = spec.name
    return specs, expansions


def _canonical_id(ref, checkpoint: str | None) -> str:
    """The id ``load_classifier`` will give the model (its output folder), without loading it."""
    if checkpoint is not None:
        return ref.name or (ref.repo_id.split("/", 1)[1] if ref.repo_id else ref.text)
    return f"{ref.repo_id}@{ref.revision}" if ref.revision else (ref.repo_id or ref.text)


# --------------------------------------------------------------------------------------------
# planning


@dataclass
class Job:
    """One model of the sweep: what its result records and where it goes."""

    spec: ModelSpec
    clf: object | None
    model_id: str
    run_dir: Path
    state: dict                    # JOB_FILE contents
    status: str = "todo"           # todo | done | failed
    error: str | None = None
    result: dict | None = None

    @property
    def group_key(self) -> str:
        return self.state["group"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def load_model(req: SweepRequest, spec: ModelSpec):
    """One model of a sweep, loaded on the CPU with the sweep's weight and preprocessing options."""
    from eval.models import load_classifier

    return load_classifier(spec.name, checkpoint=spec.checkpoint, device="cpu", remap_by_order=req.remap_by_order,
                           pretrained=req.pretrained, checkpoint_weights=req.checkpoint_weights,
                           preprocess=req.preprocess)


def _group_key(data_config: dict, opts: InferenceOptions) -> str:
    # the device normalises uint8 batches: mean/std then do not change the decoded tensors
    cfg = {k: v for k, v in data_config.items() if not (opts.device_normalizes() and k in ("mean", "std"))}
    return sha256_bytes(canonical_json({"data_config": cfg, "uint8": opts.device_normalizes(),
                                        "decode": opts.decode}))[:16]


class Sweep:
    """Plan and run a sweep (see the module docstring)."""

    def __init__(self, req: SweepRequest, *, progress: bool = True) -> None:
        self.req = req
        self.progress = progress
        self.opts = req.inference
        self.dist = _Distributed()
        if self.dist.world > 1 and self.opts.device.startswith("cuda") and ":" not in self.opts.device:
            self.opts = replace(self.opts, device=f"cuda:{self.dist.local_rank}")
        self.device = check_device(self.opts.device)
        if self.opts.amp and not self.device.startswith("cuda"):
            raise BenchError("--amp needs a CUDA device; drop --amp for CPU runs")
        self.single = len(req.models) == 1
        self.jobs: list[Job] = []

    # ---- planning ----------------------------------------------------------------------------

    def prepare(self) -> None:
        """Open and verify the suite, load and describe every model, claim output folders."""
        req = self.req
        self.info = open_suite(req.suite, revision=req.revision, configs=req.configs, mask=req.mask)
        suite = self.suite = self.info.suite
        self.configs = suite.select(list(req.configs) if req.configs else None)
        for c in self.configs:
            check_config_name(c)  # a config name that cannot be a folder is refused before any work
        self.units = {}
        for c in self.configs:
            groups, units = plan_units(suite, c, batch_size=self.opts.resolved_batch_size(),
                                       unit_rows=self.opts.unit_rows, limit_per_class=self.opts.limit_per_class)
            self.units[c] = (groups, units)
        self.out = ensure_writable_dir(Path(req.out), what="--out directory")
        self.suite_dir = self.out / _slug(suite.suite_id)
        self.session = None
        for spec in req.models:
            self._prepare_job(spec)
        # the main process claims folders and cleans leftovers; the others start after it
        if self.dist.is_main:
            session = uuid.uuid4().hex
            for job in self.jobs:
                if job.status == "todo":
                    self._claim(job, session)
        self.dist.barrier()
        for job in self.jobs:
            if job.status == "todo":
                job.state["session"] = _read_json(job.run_dir / WORK / "session.json", {}).get("session", "")

    def _prepare_job(self, spec: ModelSpec) -> None:
        req, suite, info = self.req, self.suite, self.info
        try:
            clf = load_model(req, spec)
        except Exception as e:  # noqa: BLE001 - one model's bad weights or download: recorded, the sweep goes on
            if self.single:
                raise
            self._fail_early(spec, e)
            return
        model_desc = clf.describe()
        suite_desc = {
            "id": suite.suite_id, "repo_id": suite.repo_id, "revision": suite.revision, "pinned": info.pinned,
            "manifest_sha256": suite.manifest.sha256, "suite_version": suite.manifest.suite_version,
            "configs": self.configs, "metric_family": info.metric_family, "source": info.source,
            "mask": upstream.mask_record(req.mask, suite.manifest.generator),
        }
        scoring = req.scoring
        if info.metric_family == "imagenet_star" and scoring.reference_config is None:
            scoring = ScoringOptions(**{**asdict(scoring), "reference_config": info.reference_config or "base"})
        opts = self.opts
        protocol = {"topk": opts.topk, "limit_per_class": opts.limit_per_class, "preprocess": req.preprocess,
                    "skip_bad_images": opts.skip_bad_images, "scoring": scoring.to_dict()}
        if opts.decode != "cpu":  # only a non-default decode is recorded (keeps earlier config hashes)
            protocol["decode"] = opts.decode
        chash = config_hash(model_desc, suite_desc, protocol, clf.data_config)
        run_opts = {"device": self.device, "amp": opts.amp, "amp_dtype": opts.amp_dtype if opts.amp else None,
                    "batch_size": opts.resolved_batch_size(), "channels_last": opts.channels_last,
                    "compile": opts.compile, "workers": opts.resolved_workers(),
                    "normalize_on_device": opts.device_normalizes()}
        if spec.from_wildcard:  # recorded with the run, not the protocol: the numbers are a single eval's
            run_opts["wildcard"] = {"pattern": spec.from_wildcard,
                                    "expansion": self.req.wildcards.get(spec.from_wildcard, [])}
        # checkpoints are reusable only under the same protocol and numerics (device, AMP, batch composition)
        pred_key = sha256_bytes(canonical_json({
            "config_hash": chash, "amp": run_opts["amp"], "batch_size": run_opts["batch_size"],
            "unit_rows": opts.unit_rows, "normalize_on_device": run_opts["normalize_on_device"],
            "amp_dtype": run_opts["amp_dtype"], "device": self.device.split(":")[0]}))
        run_dir = self.suite_dir / _slug(clf.model_id)
        contained(run_dir, self.out)
        n_images = sum(len(u.rows) for c in self.configs for u in self.units[c][1])
        state = {
            "model": model_desc, "data_config": clf.data_config, "suite": suite_desc, "protocol": protocol,
            "config_hash": chash, "run": {**run_opts, "predictions_key": pred_key},
            "scoring": asdict(scoring), "metric_family": info.metric_family,
            "construction_model": _is_construction_model(clf.model_id, info.construction_models),
            "partial": bool(opts.limit_per_class) or set(self.configs) != set(suite.configs),
            "units": {c: len(self.units[c][1]) for c in self.configs},
            "counts": {c: {"total": suite.manifest.config(c).rows, "kept": suite.manifest.config(c).kept}
                       for c in self.configs},
            "carried": [c for c in CARRIED_COLUMNS if c in suite.manifest.features],
            "topk": opts.topk, "notes": req.notes, "started_at": _now(),
            "reopen": {"suite": req.suite, "revision": req.revision, "mask": req.mask,
                       "configs": list(self.configs)},
            # compile decided from the model's whole workload, not what is left: a resumed or split
            # run uses the numerics of an uninterrupted one
            "compile": wants_compile(clf.model, opts, n_images=n_images, data_config=clf.data_config),
            "group": _group_key(clf.data_config, opts),
        }
        job = Job(spec, clf, clf.model_id, run_dir, state)
        if any(j.model_id == job.model_id for j in self.jobs):
            raise BenchError(f"model {job.model_id!r} is listed twice; remove the duplicate")
        result_path = run_dir / RESULT_FILE
        if result_path.exists() and not self.req.force:
            try:
                old = load_result(result_path)
            except BenchError:
                old = None
            if old and old.get("config_hash") == chash and old.get("run", {}).get("predictions_key") == pred_key:
                log.info("%s: already evaluated (%s); nothing to do (use --force to re-run)", clf.model_id, result_path)
                job.status, job.result, job.clf = "done", old, None
                if self.dist.is_main:
                    _clean_leftovers(run_dir, self.out, work_too=True)
        if job.status == "todo" and len([j for j in self.jobs if j.clf is not None]) >= self.req.max_resident:
            job.clf = None  # loaded again when its chunk runs
        self.jobs.append(job)

    def _fail_early(self, spec: ModelSpec, exc: BaseException) -> None:
        job = Job(spec, None, spec.name, contained(self.suite_dir / _slug(spec.name), self.out), {})
        self.jobs.append(job)
        if self.dist.is_main:
            self._record_failure(job, exc)
        else:
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"

    def _claim(self, job: Job, session: str) -> None:
        """Resume checkpoints made with the same predictions key; refuse to clobber other settings."""
        run_dir = ensure_writable_dir(job.run_dir, what="--out directory")
        pred_key = job.state["run"]["predictions_key"]
        old = _read_json(run_dir / RUN_STATE, {}).get("predictions_key")
        has_outputs = any((run_dir / p).exists() for p in (RESULT_FILE, "predictions", WORK))
        if old != pred_key and has_outputs and not self.req.force:
            raise BenchError(f"{run_dir} holds a run of this model and suite with other settings; pass --force to "
                             "replace it or choose another --out")
        if self.req.force or old != pred_key:
            for name in (WORK, "predictions"):
                if (run_dir / name).exists():
                    shutil.rmtree(contained(run_dir / name, self.out))
            (run_dir / RESULT_FILE).unlink(missing_ok=True)
        _clean_leftovers(run_dir, self.out, work_too=False)
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)
        atomic_write_json(run_dir / RUN_STATE, {"predictions_key": pred_key})
        atomic_write_json(run_dir / WORK / JOB_FILE, job.state)
        atomic_write_json(run_dir / WORK / "session.json", {"session": session})

    # ---- work items --------------------------------------------------------------------------

    def chunks(self) -> list[list[Job]]:
        """Models to run, by preprocessing group, in chunks of at most ``max_resident``."""
        todo = sorted((j for j in self.jobs if j.status == "todo"), key=lambda j: (j.group_key, j.model_id))
        out, by_group = [], {}
        for j in todo:
            by_group.setdefault(j.group_key, []).append(j)
        for key in sorted(by_group):
            js = by_group[key]
            out += [js[i:i + self.req.max_resident] for i in range(0, len(js), self.req.max_resident)]
        return out

    def items(self) -> list[dict]:
        """Every (chunk, config, unit) still to do, with its cost and the process it belongs to."""
        items = []
        for ci, chunk in enumerate(self.chunks()):
            for c in self.configs:
                done = {j.model_id: _done_units(j.run_dir / WORK, c) for j in chunk}
                for u in self.units[c][1]:
                    need = [j.model_id for j in chunk if u.index not in done[j.model_id]]
                    if need:
                        items.append({"chunk": ci, "group": chunk[0].group_key, "config": c, "unit": u.index,
                                      "rows": len(u.rows), "models": need, "cost": len(need) * len(u.rows)})
        # deterministic greedy balance: largest cost first onto the least-loaded process
        load = [0] * self.dist.world
        for it in sorted(items, key=lambda i: (-i["cost"], i["chunk"], i["config"], i["unit"])):
            rank = min(range(self.dist.world), key=lambda r: (load[r], r))
            it["rank"] = rank
            load[rank] += it["cost"]
        return items

    # ---- running -----------------------------------------------------------------------------

    def run(self) -> list[Job]:
        self.prepare()
        # every process computes the same split from the same state on disk: nobody writes before all planned
        items = [i for i in self.items() if i["rank"] == self.dist.rank]
        self.dist.barrier()
        total = sum(i["cost"] for i in items)
        bar = _Progress(total, len(self.jobs), sum(j.status == "done" for j in self.jobs), enabled=self.progress,
                        rank=self.dist.rank)
        try:
            for ci, chunk in enumerate(self.chunks()):
                mine = [i for i in items if i["chunk"] == ci]
                if mine:
                    self._run_chunk(chunk, mine, bar)
                for job in chunk:
                    if job.status == "todo":
                        job.clf = None  # free the weights before the next chunk loads
                        self._try_finish(job, bar)
        finally:
            bar.close()
        # the last process to finish builds what the others left (a no-op on one process)
        for job in self.jobs:
            if job.status == "todo":
                self._try_finish(job, bar)
        return self.jobs

    def _run_chunk(self, chunk: list[Job], items: list[dict], bar) -> None:
        for job in chunk:
            if job.clf is None and job.status == "todo":
                try:
                    job.clf = load_model(self.req, job.spec)
                except Exception as e:  # noqa: BLE001 - recorded for this model
                    self._record_failure(job, e)
        live = [j for j in chunk if j.status == "todo"]
        if not live:
            return
        data_config = live[0].state["data_config"]
        forwards = {}
        for job in list(live):
            try:
                # the compile decision was made on the model's whole workload (job state); "auto" keeps
                # its eager fallback should compile be unavailable
                forwards[job.model_id] = Forward(job.clf.model, self.opts, n_images=0, compile=job.state["compile"],
                                                 data_config=job.state["data_config"])
            except Exception as e:  # noqa: BLE001 - recorded for this model
                self._record_failure(job, e)
                live.remove(job)
        sch = schema(self.opts.topk, tuple(live[0].state["carried"])) if live else None
        for config in self.configs:
            mine = [i for i in items if i["config"] == config]
            if not mine or not live:
                continue
            groups, units = self.units[config]
            wanted = {i["unit"] for i in mine}
            feeds = []
            for job in live:
                if job.status != "todo":
                    continue
                ckpt = CheckpointedPredictions(job.run_dir / WORK, config, sch, session=job.state["session"])
                todo = {u for u in wanted if job.model_id in next(i["models"] for i in mine if i["unit"] == u)}
                todo -= ckpt.done_units
                feeds.append(ModelFeed(job.model_id, forwards[job.model_id], ckpt,
                                       BatchBackoff(self.opts.resolved_batch_size(), what="eval batch"), todo))
            by_id = {j.model_id: j for j in live}
            bar.config = config
            predict_units(self.suite, config, feeds, [u for u in units if u.index in wanted], groups, data_config,
                          self.opts, on_failure=None if self.single else
                          (lambda feed, exc: self._record_failure(by_id[feed.name], exc)),
                          on_unit=bar.update)

    def _record_failure(self, job: Job, exc: BaseException) -> None:
        if self.single:
            raise exc
        job.status = "failed"
        job.error = one_line(f"{type(exc).__name__}: {exc}", limit=500)
        job.clf = None
        log.error("%s failed: %s (the sweep goes on)", job.model_id, job.error)
        if self.dist.is_main or job.state:
            atomic_write_json(job.run_dir / FAILURE_FILE, {"model": job.model_id, "error": job.error, "at": _now()})

    def _try_finish(self, job: Job, bar) -> None:
        with _locked(job.run_dir / ".lock"):
            if (job.run_dir / RESULT_FILE).is_file() and not (job.run_dir / WORK / JOB_FILE).is_file():
                job.status, job.result = "done", load_result(job.run_dir / RESULT_FILE)  # another process built it
                bar.model_done()
                return
            missing = missing_units(job.run_dir)
            if missing:
                if self.dist.world == 1:
                    raise BenchError(f"{job.model_id}: units missing after the run ({_describe_missing(missing)})")
                return
            job.result = finish_run(job.run_dir, self.out, suite=self.suite)
            job.status = "done"
            bar.model_done()


# --------------------------------------------------------------------------------------------
# building results from parts (any process, or `bench eval --merge`)


def _done_units(work: Path, config: str) -> set[int]:
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
    state = _read_json(run_dir / WORK / JOB_FILE, None)
    if state is None:
        raise IntegrityError(f"{run_dir} has no {WORK}/{JOB_FILE}; it is not an unfinished bench eval run")
    out = {}
    for config, n in state["units"].items():
        safe_config_dir(run_dir / WORK, config)
        miss = sorted(set(range(n)) - _done_units(run_dir / WORK, config))
        if miss:
            out[config] = miss
    return out


def _describe_missing(missing: dict[str, list[int]]) -> str:
    parts = []
    for c, units in missing.items():
        shown = ", ".join(map(str, units[:8])) + (f" … ({len(units)} in all)" if len(units) > 8 else "")
        parts.append(f"config {c}: unit(s) {shown}")
    return "; ".join(parts)


def finish_run(run_dir: Path, out: Path, *, suite=None) -> dict:
    """Merge a model's parts into its predictions files, score, and write its result."""
    work = run_dir / WORK
    state = _read_json(work / JOB_FILE, None)
    session = _read_json(work / "session.json", {}).get("session")
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
                           "effective_batch_size": min(sizes) if sizes else None}
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
        "environment": environment(), "started_at": state["started_at"], "finished_at": _now(),
        "counts": counts, "metrics": metrics, "predictions": predictions, "flags": flags,
        "notes": state["notes"], "analysis": analysis,
    }
    write_result(run_dir / RESULT_FILE, result)
    shutil.rmtree(contained(work, out))
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
    for run_dir in runs:
        contained(run_dir, out)
        miss = missing_units(run_dir)
        if miss:
            problems.append(f"{run_dir.relative_to(out)}: {_describe_missing(miss)}")
    if problems:
        raise BenchError("cannot merge, units missing: " + " | ".join(problems) + "; rerun the sweep to fill them")
    done = []
    for run_dir in runs:
        with _locked(run_dir / ".lock"):
            if (run_dir / WORK / JOB_FILE).is_file():
                done.append((run_dir / RESULT_FILE, finish_run(run_dir, out)))
    return done


# --------------------------------------------------------------------------------------------
# plan, progress, helpers


def plan(req: SweepRequest, *, probe: bool = True) -> dict:
    """``bench eval --plan``: groups, work items per process and an estimated cost, measured on a
    probe (one unit decoded, one batch through each model) — nothing is written."""
    sw = Sweep(req, progress=False)
    sw.dist.is_main = False  # claim nothing
    sw.info = open_suite(req.suite, revision=req.revision, configs=req.configs, mask=req.mask)
    sw.suite = sw.info.suite
    sw.configs = sw.suite.select(list(req.configs) if req.configs else None)
    sw.units = {c: plan_units(sw.suite, c, batch_size=sw.opts.resolved_batch_size(), unit_rows=sw.opts.unit_rows,
                              limit_per_class=sw.opts.limit_per_class) for c in sw.configs}
    sw.out = Path(req.out)
    sw.suite_dir = sw.out / _slug(sw.suite.suite_id)
    for spec in req.models:
        sw._prepare_job(spec)
    items = sw.items()
    rates = _probe(sw) if probe else {"decode_s_per_image": {}, "forward_s_per_image": {}}
    per_rank = [0.0] * sw.dist.world
    groups = {}
    for it in items:
        g = groups.setdefault(it["group"], {"models": set(), "decodes": 0, "model_images": 0})
        g["models"].update(it["models"])
        g["decodes"] += it["rows"]
        g["model_images"] += it["cost"]
        per_rank[it["rank"]] += it["rows"] * (rates["decode_s_per_image"].get(it["group"], 0.0)
                                              + sum(rates["forward_s_per_image"].get(m, 0.0) for m in it["models"]))
    return {
        "models": [{"model": j.model_id, "status": j.status, "group": j.state.get("group"), "error": j.error}
                   for j in sw.jobs],
        "groups": {k: {**v, "models": sorted(v["models"])} for k, v in groups.items()},
        "items": items, "processes": sw.dist.world,
        "rates": rates,
        "estimated_seconds": round(max(per_rank), 1) if items and probe else None,
        "estimated_seconds_per_process": [round(s, 1) for s in per_rank] if probe else None,
    }


def _probe(sw: Sweep) -> dict:
    """Seconds per image: decode+transform of one unit per preprocessing group, and each model's
    forward pass on one batch of its group's images (after a warm-up batch)."""
    import torch

    from eval.inference import UnitDataset, make_transform

    rates = {"decode_s_per_image": {}, "forward_s_per_image": {}}
    todo = [j for j in sw.jobs if j.status == "todo"]
    if not todo or not sw.configs or not sw.units[sw.configs[0]][1]:
        return rates
    groups, units = sw.units[sw.configs[0]]
    carried = tuple(x for x in CARRIED_COLUMNS if x in sw.suite.manifest.features)
    bs = sw.opts.resolved_batch_size()
    by_group: dict[str, list[Job]] = {}
    for j in todo:
        by_group.setdefault(j.group_key, []).append(j)
    for key, jobs in sorted(by_group.items()):
        ds = UnitDataset(sw.suite.root, groups, units[:1], make_transform(jobs[0].state["data_config"],
                                                                          uint8=sw.opts.device_normalizes()), carried)
        t0 = time.perf_counter()
        item = ds[0]
        rates["decode_s_per_image"][key] = (time.perf_counter() - t0) / max(1, len(item["meta"]["image_id"]))
        x = item["x"][:bs]
        labels = torch.tensor(item["meta"]["label"][:bs], dtype=torch.long)
        for job in jobs:
            clf = job.clf or load_model(sw.req, job.spec)
            fwd = Forward(clf.model, replace(sw.opts, compile="off"), n_images=0, data_config=job.state["data_config"])
            fwd(x, labels)  # warm-up
            t0 = time.perf_counter()
            fwd(x, labels)
            rates["forward_s_per_image"][job.model_id] = (time.perf_counter() - t0) / max(1, x.shape[0])
    return rates


class _Progress:
    """One bar for the whole sweep: model-images done, images/s, ETA, models finished."""

    def __init__(self, total: int, n_models: int, done: int, *, enabled: bool, rank: int) -> None:
        from tqdm.auto import tqdm

        self.n_models, self.done = n_models, done
        self.config = ""
        self.bar = tqdm(total=total, unit="img·model", disable=not enabled, dynamic_ncols=True,
                        desc=f"sweep[{rank}]" if rank else "sweep")
        self._post()

    def _post(self) -> None:
        self.bar.set_postfix_str(f"models done {self.done}/{self.n_models} {self.config}", refresh=False)

    def update(self, rows: int, n_models: int) -> None:
        self.bar.update(rows * n_models)
        self._post()

    def model_done(self) -> None:
        self.done += 1
        self._post()

    def close(self) -> None:
        self.bar.close()


class _Distributed:
    """Process rank and world under ``accelerate launch`` / torchrun, through accelerate's
    ``PartialState``; one process otherwise (no process group is created)."""

    def __init__(self) -> None:
        self.world, self.rank, self.local_rank, self.state = 1, 0, 0, None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            self.state = PartialState()
            self.world, self.rank = self.state.num_processes, self.state.process_index
            self.local_rank = self.state.local_process_index
        self.is_main = self.rank == 0

    def barrier(self) -> None:
        if self.state is not None:
            self.state.wait_for_everyone()


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_json(path: Path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def _clean_leftovers(run_dir: Path, out: Path, *, work_too: bool) -> None:
    """Temp files of killed runs (``*.incomplete``) inside this run folder; with ``work_too`` also a
    stale ``.work`` (a run killed between writing its result and removing its checkpoints)."""
    if not run_dir.is_dir():
        return
    for p in run_dir.rglob(f"*{INCOMPLETE}"):
        if p.is_file() and not p.is_symlink():
            contained(p, out).unlink(missing_ok=True)
    if work_too and (run_dir / WORK).is_dir():
        shutil.rmtree(contained(run_dir / WORK, out))


def run_sweep(req: SweepRequest, *, progress: bool = True) -> list[Job]:
    """Run (or resume) a sweep; returns the jobs (status done / failed / todo = left to other processes)."""
    return Sweep(req, progress=progress).run()
