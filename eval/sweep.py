"""Many models, one decode: a model list scored on one suite, in one or many processes; each model
gets the files a single ``genshift.evaluate`` writes (one evaluation *is* a sweep of one model).
Groups, chunks, the work split, resume and "nothing to do": docs/performance.md, "Sweeps" and
"Resume and distribution".
"""

from __future__ import annotations

import logging
import shutil
import uuid
from contextlib import suppress
from dataclasses import asdict, dataclass, field, replace
from itertools import accumulate, groupby
from pathlib import Path

from filelock import FileLock
from tqdm.auto import tqdm

from genshift import upstream
from genshift.distributed import balance, current_process
from genshift.errors import BenchError, one_line
from genshift.eval import inference, merging, predictions
from genshift.eval.inference import predict_units
from genshift.eval.merging import WORK, finish_run, refuse_links
from genshift.eval.options import EvalOptions, ModelSpec, checkpoint_sha256
from genshift.eval.results import RESULT_FILE, config_hash, load_result
from genshift.eval.results import path_slug as slug  # the one folder rule
from genshift.eval.suite_trust import is_construction_model, open_suite
from genshift.families import get_family
from genshift.fsutil import atomic_write_json, canonical_json, ensure_writable_dir, sha256_bytes, sha256_file
from genshift.hubio import SHA_RE
from genshift.identity import folder_name
from genshift.oom import BatchBackoff
from genshift.suites import SUITES

log = logging.getLogger(__name__)
RUN_STATE = "run.json"
FAILURE_FILE = "failure.json"  # a model that failed in a sweep: the error, for the summary
# options that change how fast a run goes, never its files: left out of the request digest
RUN_ONLY = ("workers", "forward_threads", "max_resident", "force", "notes", "progress")


@dataclass(frozen=True)
class SweepRequest:
    models: tuple[ModelSpec, ...]
    suite: str
    configs: tuple[str, ...] | None = None
    out: str = "runs"
    options: EvalOptions = field(default_factory=EvalOptions)
    wildcards: dict = field(default_factory=dict)  # pattern -> expansion, recorded in each result


@dataclass
class Job:
    """One model of the sweep: what its result records (``state``, the job file) and where it goes."""

    spec: ModelSpec
    clf: object | None
    model_id: str
    run_dir: Path
    state: dict
    status: str = "todo"           # todo | done | failed
    error: str | None = None
    result: dict | None = None


def load_model(opts: EvalOptions, spec: ModelSpec):
    """One model of a sweep, loaded on the CPU with the sweep's weight and preprocessing options
    (a module given to ``genshift.evaluate`` is already loaded)."""
    if spec.classifier is not None:
        return spec.classifier
    from genshift.eval.models import load_classifier

    return load_classifier(spec.name, checkpoint=spec.checkpoint, device="cpu", remap_by_order=opts.remap_by_order,
                           pretrained=opts.pretrained, checkpoint_weights=opts.checkpoint_weights,
                           preprocess=opts.preprocess, data_config=spec.data_config)


class Sweep:
    """Plan and run a sweep (see the module docstring)."""

    def __init__(self, req: SweepRequest) -> None:
        self.req = req
        self.opts = req.options
        self.dist = current_process(self.opts.device)
        if self.dist.count > 1 and self.opts.device == "cuda":
            self.opts = replace(self.opts, device=f"cuda:{self.dist.local_index}")
        self.device = inference.check_device(self.opts.device)
        self.single = len(req.models) == 1
        self.jobs: list[Job] = []
        self.running = ""  # the config being scored, for the progress bar

    def prepare(self) -> None:
        """Find the finished runs of this request; open and verify the suite, load and describe every
        other model, claim output folders."""
        req = self.req
        self.out = Path(req.out)
        self.keys = {spec: self.request_key(spec) for spec in req.models}
        finished = {}  # request digest -> run folder, for every finished run under the output folder
        for state in () if self.opts.force else self.out.glob(f"*/*/{RUN_STATE}"):
            key, run = merging.read_state(state).get("request_key"), state.parent
            done = (run / RESULT_FILE).is_file() and not (run / WORK).exists()
            if done and key is not None and key in self.keys.values():
                finished[key] = run
        todo = [spec for spec in req.models if self.keys[spec] not in finished]
        for spec in req.models:
            if spec not in todo:
                run_dir = finished[self.keys[spec]]
                self._done(Job(spec, None, "", run_dir, {}), load_result(run_dir / RESULT_FILE))
        if not todo:
            return
        self.info = open_suite(req.suite, revision=self.opts.revision, configs=req.configs, mask=self.opts.mask)
        suite = self.suite = self.info.suite
        self.configs = suite.select(list(req.configs) if req.configs else None)
        for c in self.configs:
            merging.check_config_name(c)  # a config name that cannot be a folder is refused before any work
        self.units = {c: inference.plan_units(suite, c, batch_size=self.opts.resolved_batch_size(),
                                              unit_rows=self.opts.unit_rows, limit_per_class=self.opts.limit_per_class)
                      for c in self.configs}
        self.unit_ids = {}  # per unit, the digest of its image ids (job.json): a merge checks each part against it
        for c, (groups, units) in self.units.items():
            ids = suite.read_columns(c, ["image_id"])["image_id"].to_pylist()
            offsets = [0, *accumulate(g.num_rows for g in groups)]
            self.unit_ids[c] = [merging.unit_digest(ids[offsets[g] + r] for g, r in u.rows) for u in units]
        self.out = ensure_writable_dir(self.out, what="output folder")
        self.suite_dir = self.out / slug(suite.suite_id)
        for spec in todo:
            self._prepare_job(spec)
        # the models kept loaded are the first to run, not the first listed
        lead = set(list(dict.fromkeys(j.model_id for chunk in self.chunks() for j in chunk))[:self.opts.max_resident])
        for job in self.jobs:
            if job.model_id not in lead:
                job.clf = None
        # the main process claims folders and cleans leftovers; the others start after it
        if self.dist.is_main:
            session = uuid.uuid4().hex
            for job in self.jobs:
                if job.status == "todo":
                    self._claim(job, session)
        self.dist.wait()
        self.jobs.sort(key=lambda j: req.models.index(j.spec))
        for job in self.jobs:
            if job.status == "todo":
                job.state["session"] = merging.read_state(job.run_dir / WORK / "session.json").get("session", "")

    def request_key(self, spec: ModelSpec) -> str | None:
        """The digest of what decides a model's files: its name and weights, the suite's pin and the
        options (``RUN_ONLY`` left out); None where that is not known without the full route (an
        unpinned suite, an unresolvable Hub revision)."""
        opts, req = self.opts, self.req
        path = Path(req.suite)
        if (path / "manifest.json").is_file():
            suite = "manifest:" + sha256_file(path / "manifest.json")
        else:
            rev = opts.revision or (SUITES.get(req.suite).revision if req.suite in SUITES else None)
            if path.exists() or not rev or not SHA_RE.match(rev):
                return None
            suite = f"{req.suite}@{rev}"
        weights = self._weights_key(spec)
        if weights is None:
            return None
        numbers = {k: v for k, v in asdict(opts).items() if k not in RUN_ONLY}
        numbers.update(device=opts.device.split(":")[0], batch_size=opts.resolved_batch_size(),
                       normalize_on_device=opts.device_normalizes(),
                       mask=sha256_file(opts.mask) if opts.mask and Path(opts.mask).is_file() else opts.mask)
        return sha256_bytes(canonical_json({"model": spec.name, "weights": weights, "suite": suite,
                                            "configs": list(req.configs or ()), "options": numbers}))

    def _weights_key(self, spec: ModelSpec) -> str | None:
        from genshift.eval.models import parse_model_name, resolve_model_revision

        if spec.classifier is not None:
            return canonical_json([spec.classifier.model_id, spec.classifier.data_config]).decode()
        if spec.checkpoint is not None:
            return "sha256:" + checkpoint_sha256(spec.checkpoint)
        if not self.opts.pretrained:
            return "random"
        try:
            ref = parse_model_name(spec.name)
            return f"{ref.repo_id}@{resolve_model_revision(ref.repo_id, ref.revision)}" if ref.repo_id else None
        except BenchError:  # offline and not cached: the full route says so
            return None

    def _done(self, job: Job, result: dict) -> None:
        job.status, job.result, job.clf, job.model_id = "done", result, None, result["model"]["id"]
        log.info("%s: already evaluated (%s); nothing to do (force=True re-runs it)", job.model_id,
                 job.run_dir / RESULT_FILE)
        self.jobs.append(job)

    def _prepare_job(self, spec: ModelSpec) -> None:
        req, suite, info, opts = self.req, self.suite, self.info, self.opts
        try:
            clf = load_model(opts, spec)
        except Exception as e:  # noqa: BLE001 - one model's bad weights or download: recorded, the sweep goes on
            if self.single:
                raise
            job = Job(spec, None, spec.name, merging.contained(self.suite_dir / slug(spec.name), self.out), {})
            self.jobs.append(job)
            self._record_failure(job, e)  # its failure file written by the main process only (no job state)
            return
        model_desc = clf.describe()
        suite_desc = {
            "id": suite.suite_id, "repo_id": suite.repo_id, "revision": suite.revision, "pinned": info.pinned,
            "manifest_sha256": suite.manifest.sha256, "suite_version": suite.manifest.suite_version,
            "configs": self.configs, "metric_family": info.metric_family, "source": info.source,
            "mask": upstream.mask_record(opts.mask, suite.manifest.generator),
        }
        scoring = opts.scoring((info.reference_config or "base") if get_family(info.metric_family).reference else None)
        protocol = {"topk": opts.topk, "limit_per_class": opts.limit_per_class, "preprocess": opts.preprocess,
                    "skip_bad_images": opts.skip_bad_images, "scoring": scoring.to_dict()}
        if opts.decode != "cpu":  # only a non-default decode is recorded (keeps earlier config hashes)
            protocol["decode"] = opts.decode
        if spec.data_config_from:  # a population's recorded data config (e.g. timm 0.6.12's), not today's timm's
            protocol["data_config"] = spec.data_config_from
        chash = config_hash(model_desc, suite_desc, protocol, clf.data_config)
        n_images = sum(len(u.rows) for c in self.configs for u in self.units[c][1])
        # compile decided from the model's whole workload, not what is left: a resumed or split
        # run uses the numerics of an uninterrupted one
        compiled = inference.wants_compile(opts, n_images=n_images)
        run_opts = {"device": self.device, "amp": opts.amp, "amp_dtype": opts.amp_dtype if opts.amp else None,
                    "batch_size": opts.resolved_batch_size(), "channels_last": opts.channels_last,
                    "compile": opts.compile, "workers": opts.resolved_workers(),
                    "normalize_on_device": opts.device_normalizes(), "cpu_threads": opts.cpu_threads,
                    "processes": self.dist.count, "forward_threads": opts.resolved_forward_threads(compiled=compiled)}
        if spec.from_wildcard:  # recorded with the run, not the protocol: the numbers are a single eval's
            expansion = req.wildcards.get(spec.from_wildcard, [])
            run_opts["wildcard"] = {"pattern": spec.from_wildcard, "expansion": expansion}
        # checkpoints are reusable only under the same protocol and everything that changes the numbers:
        # device type, AMP and its dtype, batch composition, CPU threads, compile, decode normalisation
        pred_key = sha256_bytes(canonical_json({
            "config_hash": chash, "amp": run_opts["amp"], "batch_size": run_opts["batch_size"],
            "unit_rows": opts.unit_rows, "normalize_on_device": run_opts["normalize_on_device"],
            "amp_dtype": run_opts["amp_dtype"], "device": self.device.split(":")[0],
            "cpu_threads": opts.cpu_threads, "compiled": compiled}))
        run_dir = self.suite_dir / folder_name(clf.model_id)
        merging.contained(run_dir, self.out)
        state = {
            "model": model_desc, "data_config": clf.data_config, "suite": suite_desc, "protocol": protocol,
            "config_hash": chash, "run": {**run_opts, "predictions_key": pred_key},
            "scoring": asdict(scoring), "metric_family": info.metric_family,
            "construction_model": is_construction_model(clf.declared_name or clf.model_id, info.construction_models,
                                                        clf.weights_sha256),
            "partial": bool(opts.limit_per_class) or set(self.configs) != set(suite.configs),
            "units": {c: len(self.units[c][1]) for c in self.configs},
            "unit_ids": self.unit_ids,
            "counts": {c: {"total": suite.manifest.config(c).rows, "kept": suite.manifest.config(c).kept}
                       for c in self.configs},
            "carried": [c for c in predictions.CARRIED_COLUMNS if c in suite.manifest.features],
            "topk": opts.topk, "notes": opts.notes, "started_at": merging.now(),
            "reopen": {"suite": req.suite, "revision": opts.revision, "mask": opts.mask, "configs": list(self.configs)},
            "compile": compiled,
            # the preprocessing group: the device normalises uint8 batches, mean/std then do not change the tensors
            "group": sha256_bytes(canonical_json({
                "data_config": {k: v for k, v in clf.data_config.items()
                                if not (opts.device_normalizes() and k in ("mean", "std"))},
                "uint8": opts.device_normalizes(), "decode": opts.decode}))[:16],
            # the process-wide settings the forward passes ran with (the result's environment records them)
            "ran": {"torch_threads": opts.cpu_threads,
                    "cudnn_benchmark": self.device.startswith("cuda") and opts.cudnn_benchmark},
        }
        job = Job(spec, clf, clf.model_id, run_dir, state)
        if any(j.model_id == job.model_id for j in self.jobs):
            raise BenchError(f"model {job.model_id!r} is listed twice; remove the duplicate")
        if (run_dir / RESULT_FILE).exists() and not opts.force:
            old = None
            with suppress(BenchError):
                old = load_result(run_dir / RESULT_FILE)
            if old and old.get("config_hash") == chash and old.get("run", {}).get("predictions_key") == pred_key:
                self._done(job, old)
                if self.dist.is_main:
                    merging.clean_leftovers(run_dir, self.out, work_too=True)
                    self._write_state(job)  # the next rerun of this request finds it at once
                return
        if len([j for j in self.jobs if j.clf is not None]) >= opts.max_resident:
            job.clf = None  # loaded again when its chunk runs
        self.jobs.append(job)

    def _write_state(self, job: Job) -> None:
        atomic_write_json(job.run_dir / RUN_STATE, {"predictions_key": job.state["run"]["predictions_key"],
                                                    "request_key": self.keys.get(job.spec)})

    def _claim(self, job: Job, session: str) -> None:
        """Resume checkpoints made with the same predictions key; refuse to clobber other settings."""
        run_dir = ensure_writable_dir(job.run_dir, what="output folder")
        pred_key = job.state["run"]["predictions_key"]
        old = merging.read_state(run_dir / RUN_STATE).get("predictions_key")
        has_outputs = any((run_dir / p).exists() for p in (RESULT_FILE, "predictions", WORK))
        if old != pred_key and has_outputs and not self.opts.force:
            raise BenchError(f"{run_dir} holds a run of this model and suite with other settings; re-run with "
                             "force=True (--force) to replace it, or choose another output folder")
        if self.opts.force or old != pred_key:
            for name in (WORK, "predictions"):
                if (run_dir / name).exists():
                    shutil.rmtree(refuse_links(run_dir / name, self.out))
            (run_dir / RESULT_FILE).unlink(missing_ok=True)
        merging.clean_leftovers(run_dir, self.out, work_too=False)
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)
        self._write_state(job)
        atomic_write_json(run_dir / WORK / merging.JOB_FILE, job.state)
        atomic_write_json(run_dir / WORK / "session.json", {"session": session})

    def chunks(self) -> list[list[Job]]:
        """Models to run, by preprocessing group, in chunks of at most ``max_resident``."""
        todo = sorted((j for j in self.jobs if j.status == "todo"), key=lambda j: (j.state["group"], j.model_id))
        groups = [list(js) for _, js in groupby(todo, key=lambda j: j.state["group"])]
        n = self.opts.max_resident
        return [js[i:i + n] for js in groups for i in range(0, len(js), n)]

    def items(self) -> list[dict]:
        """Every (chunk, config, unit) still to do, with its cost and the process it belongs to."""
        items = []
        for ci, chunk in enumerate(self.chunks()):
            for c in self.configs:
                done = {j.model_id: merging.done_units(j.run_dir / WORK / c, len(self.units[c][1])) for j in chunk}
                for u in self.units[c][1]:
                    need = [j.model_id for j in chunk if u.index not in done[j.model_id]]
                    if need:
                        items.append({"chunk": ci, "config": c, "unit": u.index, "key": (ci, c, u.index),
                                      "models": need, "cost": len(need) * len(u.rows), "rows": len(u.rows)})
        return balance(items, self.dist.count)

    def run(self) -> list[Job]:
        with inference.torch_state(self.opts):
            self.prepare()
            if all(j.status != "todo" for j in self.jobs):
                return self.jobs
            # every process computes the same split from the same state on disk: nobody writes before all planned
            items = [i for i in self.items() if i["rank"] == self.dist.index]
            self.dist.wait()
            self.bar = tqdm(total=sum(i["cost"] for i in items), unit="img·model", dynamic_ncols=True,
                            disable=not (self.opts.progress and items),
                            desc=f"sweep[{self.dist.index}]" if self.dist.index else "sweep")
            self._progress()
            try:
                for ci, chunk in enumerate(self.chunks()):
                    mine = [i for i in items if i["chunk"] == ci]
                    if mine:
                        self._run_chunk(chunk, mine)
                    for job in chunk:
                        if job.status == "todo":
                            job.clf = None  # free the weights before the next chunk loads
                            self._try_finish(job)
            finally:
                self.bar.close()
            # the last process to finish builds what the others left (a no-op on one process)
            for job in self.jobs:
                if job.status == "todo":
                    self._try_finish(job)
        return self.jobs

    def _progress(self, rows: int = 0, n_models: int = 0) -> None:
        """The bar: model-images done (rows x models served), images/s, ETA, models finished."""
        self.bar.update(rows * n_models)
        done = sum(j.status == "done" for j in self.jobs)
        self.bar.set_postfix_str(f"models done {done}/{len(self.jobs)} {self.running}", refresh=False)

    def _run_chunk(self, chunk: list[Job], items: list[dict]) -> None:
        forwards = {}
        try:
            for job in chunk:
                if job.status != "todo":
                    continue
                try:  # each model normalises with its own data config (a group may share only the decode)
                    if job.clf is None:
                        job.clf = load_model(self.opts, job.spec)
                    forwards[job.model_id] = inference.Forward(job.clf.model, self.opts, compile=job.state["compile"],
                                                               data_config=job.state["data_config"])
                except Exception as e:  # noqa: BLE001 - recorded for this model
                    self._record_failure(job, e)
            for config in self.configs:
                mine = {i["unit"]: i["models"] for i in items if i["config"] == config}
                live = [j for j in chunk if j.status == "todo"]
                if not mine or not live:
                    continue
                groups, units = self.units[config]
                data_config = live[0].state["data_config"]
                sch = predictions.schema(self.opts.topk, tuple(live[0].state["carried"]))
                feeds = []
                for job in live:
                    ckpt = merging.CheckpointedPredictions(
                        job.run_dir / WORK, config, sch, session=job.state["session"], rank=self.dist.index,
                        run_key=job.state["run"]["predictions_key"], n_units=len(units))
                    todo = {u for u, models in mine.items() if job.model_id in models} - ckpt.done_units
                    feeds.append(inference.ModelFeed(job.model_id, forwards[job.model_id], ckpt,
                                                     BatchBackoff(self.opts.resolved_batch_size(), what="eval batch"),
                                                     todo))
                by_id = {j.model_id: j for j in live}
                self.running = config
                predict_units(self.suite, config, feeds, [u for u in units if u.index in mine], groups, data_config,
                              self.opts, on_failure=None if self.single else
                              (lambda feed, exc, by_id=by_id: self._record_failure(by_id[feed.name], exc)),
                              on_unit=self._progress,
                              transform=live[0].clf.transform if "transform" in data_config else None)
        finally:
            for f in forwards.values():
                f.close()

    def _record_failure(self, job: Job, exc: BaseException) -> None:
        if self.single:
            raise exc
        job.status, job.error, job.clf = "failed", one_line(f"{type(exc).__name__}: {exc}", limit=500), None
        log.error("%s failed: %s (the sweep goes on)", job.model_id, job.error)
        if self.dist.is_main or job.state:
            failure = {"model": job.model_id, "error": job.error, "at": merging.now()}
            atomic_write_json(job.run_dir / FAILURE_FILE, failure)

    def _try_finish(self, job: Job) -> None:
        with FileLock(job.run_dir / ".lock"):  # one process builds the result
            if (job.run_dir / RESULT_FILE).is_file() and not (job.run_dir / WORK / merging.JOB_FILE).is_file():
                job.status, job.result = "done", load_result(job.run_dir / RESULT_FILE)  # another process built it
                self._progress()
                return
            missing = merging.missing_units(job.run_dir, self.out)
            if missing and self.dist.count == 1:
                raise BenchError(f"{job.model_id}: units missing after the run ({merging.describe_missing(missing)})")
            if not missing:  # else another process still has units of it
                job.result, job.status = finish_run(job.run_dir, self.out, suite=self.suite), "done"
                self._progress()


def run_sweep(req: SweepRequest) -> list[Job]:
    """Run (or resume) a sweep; returns the jobs (status done / failed / todo = left to other processes)."""
    return Sweep(req).run()
