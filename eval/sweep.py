"""Many models, one decode: ``bench eval`` over a model list, in one or many processes.

A sweep scores every model of a list on one suite and writes, for each model, exactly the
``result.json`` and ``predictions/<config>.parquet`` a single ``bench eval`` of that model
writes (a single ``bench eval`` *is* a sweep of one model), so the results store, ``bench
verify`` and ``bench submit`` need no change.

How the work is shared:

- **Preprocessing groups.** Models are grouped by their resolved data config (input size, crop,
  interpolation, and mean/std unless the device normalises); each streaming unit of a config is
  decoded and transformed once per group and fed to every model of the group. At most
  ``max_resident`` models are loaded at once (a larger group is processed in chunks). While a
  chunk runs, a background thread loads the next chunks' models into the slots left free
  (``max_resident`` minus the models loaded), so a model's start-up overlaps another's forward;
  the loaded weights are the same, so the predictions are too.
- **Groups in flight.** Up to ``groups_in_flight`` chunks run at once, each on its own thread with
  its own DataLoader, as long as their models fit in ``max_resident``: the next group's workers
  decode, and its models compute on the cores the current group leaves idle, while the current
  group still runs, instead of the next loader starting cold at the group boundary. Chunks start
  largest first (models x input pixels), so the last to start is the cheapest and the groups in
  flight end together. Each model still sees the same batches at the same ``--cpu-threads``, so
  its bytes are a single run's. ``Sweep.timeline`` records every unit's decode, wait and forward
  spans (``genshift.eval.busy``).
- **Decode ahead.** Streams (a chunk's config) run in a fixed order; once a stream has its first
  unit, the next stream not yet started starts its DataLoader, so its workers decode its first
  units while the current models compute and its models never wait for a cold loader.
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

Model lists are ``genshift.eval.model_list``, the process split ``genshift.eval.work_split``, building results from
parts ``genshift.eval.merging``, ``--plan`` ``genshift.eval.sweep_plan`` and the bar ``genshift.eval.progress``.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from genshift import upstream
from genshift.errors import BenchError, one_line
from genshift.fsutil import INCOMPLETE, atomic_write_json, canonical_json, ensure_writable_dir, sha256_bytes
from genshift.oom import BatchBackoff
from genshift.builders.determinism import fixed_threads
from genshift.eval.busy import busy_shares
from genshift.eval.inference import (
    Forward, InferenceOptions, ModelFeed, UnitStream, check_device, plan_units, predict_units, start_stream, wants_compile,
)
from genshift.eval.merging import (
    JOB_FILE, WORK, describe_missing, done_units, finish_run, locked, missing_units, now, read_json, refuse_links,
)
from genshift.eval.model_list import ModelSpec
from genshift.eval.predictions import CARRIED_COLUMNS, CheckpointedPredictions, check_config_name, contained, schema, unit_digest
from genshift.eval.progress import Progress
from genshift.eval.results import RESULT_FILE, config_hash, load_result, path_slug as slug  # the one folder rule
from genshift.identity import folder_name
from genshift.eval.scoring import ScoringOptions
from genshift.eval.suite_open import is_construction_model, open_suite
from genshift.eval.work_split import Distributed, balance

log = logging.getLogger(__name__)
RUN_STATE = "run.json"
FAILURE_FILE = "failure.json"  # a model that failed in a sweep: the error, for the summary


@dataclass(frozen=True)
class SweepRequest:
    models: tuple[ModelSpec, ...]
    suite: str
    configs: tuple[str, ...] | None = None
    revision: str | None = None
    remap_by_order: bool = False
    checkpoint_weights: str = "model"  # "model" | "ema": which weights of a training checkpoint
    preprocess: str = "timm"           # genshift.eval.models.PREPROCESS
    mask: str | None = None
    out: str = "runs"
    force: bool = False
    inference: InferenceOptions = field(default_factory=InferenceOptions)
    scoring: ScoringOptions = field(default_factory=ScoringOptions)
    notes: str = ""
    max_resident: int = 4
    pretrained: bool = True       # False: random weights (benchmarks); never from the CLI
    wildcards: dict = field(default_factory=dict)  # pattern -> expansion, recorded in each result
    preload: bool = True          # load the next chunk's models in the background (free slots only)
    groups_in_flight: int = 2     # chunks run at once (each its own loader and thread), within max_resident
    decode_ahead: bool = True     # start the next stream's decode once the current one has its first unit


class Interrupted(KeyboardInterrupt):
    """A chunk stopped because the sweep was (Ctrl-C, SIGTERM, another chunk's error)."""


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


def unit_digests(suite, config: str, groups, units) -> list[str]:
    """Per streaming unit, the digest of the image ids it holds (job.json): what lets a merge check
    that a part's rows are its units' images."""
    ids = suite.read_columns(config, ["image_id"])["image_id"].to_pylist()
    offsets = [0]
    for g in groups:
        offsets.append(offsets[-1] + g.num_rows)
    return [unit_digest(ids[offsets[g] + r] for g, r in u.rows) for u in units]


def load_model(req: SweepRequest, spec: ModelSpec):
    """One model of a sweep, loaded on the CPU with the sweep's weight and preprocessing options."""
    from genshift.eval.models import load_classifier

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
        self.dist = Distributed(self.opts.device)
        if self.dist.world > 1 and self.opts.device.startswith("cuda") and ":" not in self.opts.device:
            self.opts = replace(self.opts, device=f"cuda:{self.dist.local_rank}")
        self.device = check_device(self.opts.device)
        self.single = len(req.models) == 1
        self.jobs: list[Job] = []
        self._loading: dict[str, Future] = {}  # model id -> its background load (req.preload)
        self._slots = threading.Lock()         # models held (loaded, loading, reserved), read and changed by threads
        self._reserved: set[str] = set()       # models of the chunks started and not finished
        self._stop = threading.Event()         # set when the run is interrupted: running chunks stop at a unit
        self.timeline: list[dict] = []         # genshift.eval.busy events, one per unit streamed
        self.busy: dict | None = None          # genshift.eval.busy.busy_shares of the run
        self._streams: dict[tuple[int, str], UnitStream | None] = {}  # started ahead (None: taken by its chunk)
        self._stream_order: list[tuple[int, str]] = []                # (chunk, config) in run order
        self._stream_lock = threading.Lock()

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
        self.unit_ids = {c: unit_digests(suite, c, *self.units[c]) for c in self.configs}
        self.out = ensure_writable_dir(Path(req.out), what="--out directory")
        self.suite_dir = self.out / slug(suite.suite_id)
        self.session = None
        for spec in req.models:
            self._prepare_job(spec)
        # the models kept loaded are the first to run, not the first listed
        lead = set(list(dict.fromkeys(j.model_id for chunk in self.chunks() for j in chunk))[:req.max_resident])
        for job in self.jobs:
            if job.model_id not in lead:
                job.clf = None
        # the main process claims folders and cleans leftovers; the others start after it
        if self.dist.is_main:
            session = uuid.uuid4().hex
            for job in self.jobs:
                if job.status == "todo":
                    self._claim(job, session)
        self.dist.barrier()
        for job in self.jobs:
            if job.status == "todo":
                job.state["session"] = read_json(job.run_dir / WORK / "session.json", {}).get("session", "")

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
                    "normalize_on_device": opts.device_normalizes(), "cpu_threads": opts.cpu_threads,
                    "processes": self.dist.world}
        if spec.from_wildcard:  # recorded with the run, not the protocol: the numbers are a single eval's
            run_opts["wildcard"] = {"pattern": spec.from_wildcard,
                                    "expansion": self.req.wildcards.get(spec.from_wildcard, [])}
        n_images = sum(len(u.rows) for c in self.configs for u in self.units[c][1])
        # compile decided from the model's whole workload, not what is left: a resumed or split
        # run uses the numerics of an uninterrupted one
        compiled = wants_compile(clf.model, opts, n_images=n_images, data_config=clf.data_config)
        run_opts["forward_threads"] = opts.resolved_forward_threads(compiled=compiled)
        # checkpoints are reusable only under the same protocol and everything that changes the numbers:
        # device type, AMP and its dtype, batch composition, CPU threads, compile, decode normalisation
        pred_key = sha256_bytes(canonical_json({
            "config_hash": chash, "amp": run_opts["amp"], "batch_size": run_opts["batch_size"],
            "unit_rows": opts.unit_rows, "normalize_on_device": run_opts["normalize_on_device"],
            "amp_dtype": run_opts["amp_dtype"], "device": self.device.split(":")[0],
            "cpu_threads": opts.cpu_threads, "compiled": compiled}))
        run_dir = self.suite_dir / folder_name(clf.model_id)
        contained(run_dir, self.out)
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
            "carried": [c for c in CARRIED_COLUMNS if c in suite.manifest.features],
            "topk": opts.topk, "notes": req.notes, "started_at": now(),
            "reopen": {"suite": req.suite, "revision": req.revision, "mask": req.mask,
                       "configs": list(self.configs)},
            "compile": compiled,
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
        job = Job(spec, None, spec.name, contained(self.suite_dir / slug(spec.name), self.out), {})
        self.jobs.append(job)
        if self.dist.is_main:
            self._record_failure(job, exc)
        else:
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"

    def _claim(self, job: Job, session: str) -> None:
        """Resume checkpoints made with the same predictions key; refuse to clobber other settings."""
        run_dir = ensure_writable_dir(job.run_dir, what="--out directory")
        pred_key = job.state["run"]["predictions_key"]
        old = read_json(run_dir / RUN_STATE, {}).get("predictions_key")
        has_outputs = any((run_dir / p).exists() for p in (RESULT_FILE, "predictions", WORK))
        if old != pred_key and has_outputs and not self.req.force:
            raise BenchError(f"{run_dir} holds a run of this model and suite with other settings; pass --force to "
                             "replace it or choose another --out")
        if self.req.force or old != pred_key:
            for name in (WORK, "predictions"):
                if (run_dir / name).exists():
                    shutil.rmtree(refuse_links(run_dir / name, self.out))
            (run_dir / RESULT_FILE).unlink(missing_ok=True)
        _clean_leftovers(run_dir, self.out, work_too=False)
        (run_dir / FAILURE_FILE).unlink(missing_ok=True)
        atomic_write_json(run_dir / RUN_STATE, {"predictions_key": pred_key})
        atomic_write_json(run_dir / WORK / JOB_FILE, job.state)
        atomic_write_json(run_dir / WORK / "session.json", {"session": session})

    # ---- work items --------------------------------------------------------------------------

    def chunks(self) -> list[list[Job]]:
        """Models to run, by preprocessing group, in chunks of at most ``max_resident``; the costliest
        group first (models x input pixels: a proxy of forward cost known before any forward), so
        that with groups in flight the last chunk to start is a cheap one."""
        todo = sorted((j for j in self.jobs if j.status == "todo"), key=lambda j: (j.group_key, j.model_id))
        out, by_group = [], {}
        for j in todo:
            by_group.setdefault(j.group_key, []).append(j)

        def cost(key: str) -> int:
            _, h, w = by_group[key][0].state["data_config"]["input_size"]
            return len(by_group[key]) * h * w

        for key in sorted(by_group, key=lambda k: (-cost(k), k)):
            js = by_group[key]
            out += [js[i:i + self.req.max_resident] for i in range(0, len(js), self.req.max_resident)]
        return out

    def items(self) -> list[dict]:
        """Every (chunk, config, unit) still to do, with its cost and the process it belongs to."""
        items = []
        for ci, chunk in enumerate(self.chunks()):
            for c in self.configs:
                done = {j.model_id: done_units(j.run_dir / WORK, c, len(self.units[c][1])) for j in chunk}
                for u in self.units[c][1]:
                    need = [j.model_id for j in chunk if u.index not in done[j.model_id]]
                    if need:
                        items.append({"chunk": ci, "group": chunk[0].group_key, "config": c, "unit": u.index,
                                      "rows": len(u.rows), "models": need, "cost": len(need) * len(u.rows)})
        return balance(items, self.dist.world)

    # ---- running -----------------------------------------------------------------------------

    def run(self) -> list[Job]:
        with fixed_threads(self.opts.cpu_threads):
            return self._run()

    def _run(self) -> list[Job]:
        self.prepare()
        # every process computes the same split from the same state on disk: nobody writes before all planned
        items = [i for i in self.items() if i["rank"] == self.dist.rank]
        self.dist.barrier()
        total = sum(i["cost"] for i in items)
        bar = Progress(total, len(self.jobs), sum(j.status == "done" for j in self.jobs), enabled=self.progress,
                        rank=self.dist.rank)
        chunks = self.chunks()
        ahead = [j for ci, chunk in enumerate(chunks) if any(i["chunk"] == ci for i in items) for j in chunk]
        self._chunks, self._items = chunks, items
        keys = {(i["chunk"], i["config"]) for i in items}
        self._stream_order = [(ci, c) for ci in range(len(chunks)) for c in self.configs if (ci, c) in keys]
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweep-preload") if self.req.preload else None
        # one chunk at a time runs on this thread, as a single bench eval always does
        n_lanes = min(self.req.groups_in_flight, len({i["chunk"] for i in items}))
        lanes = ThreadPoolExecutor(max_workers=n_lanes, thread_name_prefix="sweep-group") if n_lanes > 1 else None
        in_flight: set[Future] = set()
        start = time.perf_counter()
        try:
            for ci, chunk in enumerate(chunks):
                mine = [i for i in items if i["chunk"] == ci]
                if not mine:
                    self._finish_chunk(chunk, bar)
                    continue
                while in_flight and not self._room_for(chunk, len(in_flight)):
                    in_flight = self._wait_one(in_flight)
                with self._slots:
                    self._reserved |= {j.model_id for j in chunk if j.status == "todo"}
                ids = {j.model_id for j in chunk}
                ahead = [j for j in ahead if j.model_id not in ids]
                args = (ci, chunk, mine, bar, (pool, list(ahead)) if pool else None)
                if lanes is None:
                    self._lane(*args)
                else:
                    in_flight.add(lanes.submit(self._lane, *args))
            while in_flight:
                in_flight = self._wait_one(in_flight)
        except BaseException:
            self._stop.set()  # Ctrl-C, SIGTERM or a failed chunk: the others stop at their next unit
            raise
        finally:
            if lanes is not None:
                lanes.shutdown(wait=True, cancel_futures=True)
            with self._stream_lock:
                self._streams = {k: None for k in self._streams}  # unused streams' workers end with them
            bar.close()
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        self.busy = busy_shares(self.timeline, time.perf_counter() - start)
        log.info("sweep busy: %s", json.dumps(self.busy))  # genshift.eval.busy: shares of the wall time, waits in seconds
        # the last process to finish builds what the others left (a no-op on one process)
        for job in self.jobs:
            if job.status == "todo":
                self._try_finish(job, bar)
        return self.jobs

    def _held(self) -> set[str]:
        """Models that count against ``max_resident``: loaded, loading, or in a chunk that has started."""
        return {j.model_id for j in self.jobs if j.clf is not None} | set(self._loading) | self._reserved

    def _room_for(self, chunk: list[Job], running: int) -> bool:
        """Another chunk may start: fewer than ``groups_in_flight`` run and its models fit in
        ``max_resident`` next to those held."""
        with self._slots:
            held = self._held()
            new = {j.model_id for j in chunk if j.status == "todo"} - held
            return running < self.req.groups_in_flight and len(held) + len(new) <= self.req.max_resident

    @staticmethod
    def _wait_one(in_flight: set[Future]) -> set[Future]:
        """Wait for a running chunk to end; its error (a single run's) is raised here."""
        done, rest = wait(in_flight, return_when=FIRST_COMPLETED)
        for f in done:
            f.result()
        return rest

    def _lane(self, ci: int, chunk: list[Job], items: list[dict], bar, preload) -> None:
        """One chunk, on its own thread: load, stream, then build its models' results."""
        events: list[dict] = []
        try:
            self._run_chunk(chunk, items, bar, preload=preload, timeline=events, ci=ci)
        finally:
            for e in events:
                e["chunk"] = ci
            self.timeline.extend(events)
        self._finish_chunk(chunk, bar)

    def _finish_chunk(self, chunk: list[Job], bar) -> None:
        for job in chunk:
            with self._slots:
                if job.status == "todo":
                    job.clf = None  # free the weights before the next chunk loads
                self._reserved.discard(job.model_id)
            if job.status == "todo":
                self._try_finish(job, bar)

    def _preload(self, pool: ThreadPoolExecutor, ahead: list[Job]) -> None:
        """Start loading the next chunks' models, in run order, into the slots left free: models
        loaded plus models loading never exceed ``max_resident``."""
        with self._slots:
            busy = len(self._held())
            for job in ahead:
                if busy >= self.req.max_resident:
                    return
                if job.status == "todo" and job.clf is None and job.model_id not in self._loading:
                    self._loading[job.model_id] = pool.submit(load_model, self.req, job.spec)
                    busy += 1

    def _stream_units(self, key: tuple[int, str]) -> list:
        ci, config = key
        wanted = {i["unit"] for i in self._items if i["chunk"] == ci and i["config"] == config}
        return [u for u in self.units[config][1] if u.index in wanted]

    def _decode_ahead(self) -> None:
        """Start the first stream in run order that has not started (``decode_ahead``)."""
        if not self.req.decode_ahead or self._stop.is_set():
            return
        with self._stream_lock:
            key = next((k for k in self._stream_order if k not in self._streams), None)
            if key is None:
                return
            chunk = [j for j in self._chunks[key[0]] if j.state]
            self._streams[key] = start_stream(self.suite, self.units[key[1]][0], self._stream_units(key),
                                              chunk[0].state["data_config"], self.opts)

    def _take_stream(self, key: tuple[int, str]) -> UnitStream | None:
        """The stream started ahead for ``key``, if any; from now on it is this chunk's."""
        with self._stream_lock:
            stream = self._streams.get(key)
            self._streams[key] = None
            return stream

    def _run_chunk(self, chunk: list[Job], items: list[dict], bar, preload=None, timeline=None, ci=None) -> None:
        for job in chunk:
            if job.clf is None and job.status == "todo":
                try:
                    with self._slots:
                        pending = self._loading.get(job.model_id)
                    try:
                        clf = pending.result() if pending else load_model(self.req, job.spec)
                    finally:
                        with self._slots:
                            self._loading.pop(job.model_id, None)
                    with self._slots:
                        job.clf = clf
                except Exception as e:  # noqa: BLE001 - recorded for this model
                    self._record_failure(job, e)
        live = [j for j in chunk if j.status == "todo"]
        if preload:
            self._preload(*preload)  # the next chunks' models load while this chunk's forward runs
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
                ckpt = CheckpointedPredictions(job.run_dir / WORK, config, sch, session=job.state["session"],
                                               rank=self.dist.rank, run_key=job.state["run"]["predictions_key"],
                                               n_units=len(units))
                todo = {u for u in wanted if job.model_id in next(i["models"] for i in mine if i["unit"] == u)}
                todo -= ckpt.done_units
                feeds.append(ModelFeed(job.model_id, forwards[job.model_id], ckpt,
                                       BatchBackoff(self.opts.resolved_batch_size(), what="eval batch"), todo))
            by_id = {j.model_id: j for j in live}
            bar.config = config
            predict_units(self.suite, config, feeds, [u for u in units if u.index in wanted], groups, data_config,
                          self.opts, on_failure=None if self.single else
                          (lambda feed, exc: self._record_failure(by_id[feed.name], exc)),
                          on_unit=self._on_unit(bar), timeline=timeline, stream=self._take_stream((ci, config)))

    def _on_unit(self, bar):
        first = [True]

        def on_unit(rows: int, n_models: int) -> None:
            if self._stop.is_set():  # another chunk failed or the run was interrupted: flush and stop here
                raise Interrupted("the sweep was stopped")
            bar.update(rows, n_models)
            if first[0]:  # this stream is under way: the next one starts decoding
                first[0] = False
                self._decode_ahead()
        return on_unit

    def _record_failure(self, job: Job, exc: BaseException) -> None:
        if self.single:
            raise exc
        job.status = "failed"
        job.error = one_line(f"{type(exc).__name__}: {exc}", limit=500)
        job.clf = None
        log.error("%s failed: %s (the sweep goes on)", job.model_id, job.error)
        if self.dist.is_main or job.state:
            atomic_write_json(job.run_dir / FAILURE_FILE, {"model": job.model_id, "error": job.error, "at": now()})

    def _try_finish(self, job: Job, bar) -> None:
        with locked(job.run_dir / ".lock"):
            if (job.run_dir / RESULT_FILE).is_file() and not (job.run_dir / WORK / JOB_FILE).is_file():
                job.status, job.result = "done", load_result(job.run_dir / RESULT_FILE)  # another process built it
                bar.model_done()
                return
            missing = missing_units(job.run_dir, self.out)
            if missing:
                if self.dist.world == 1:
                    raise BenchError(f"{job.model_id}: units missing after the run ({describe_missing(missing)})")
                return
            job.result = finish_run(job.run_dir, self.out, suite=self.suite)
            job.status = "done"
            bar.model_done()


def _clean_leftovers(run_dir: Path, out: Path, *, work_too: bool) -> None:
    """Temp files of killed runs (``*.incomplete``) inside this run folder; with ``work_too`` also a
    stale ``.work`` (a run killed between writing its result and removing its checkpoints)."""
    if not run_dir.is_dir():
        return
    for p in run_dir.rglob(f"*{INCOMPLETE}"):
        if p.is_file() and not p.is_symlink():
            refuse_links(p, out).unlink(missing_ok=True)
    if work_too and (run_dir / WORK).is_dir():
        shutil.rmtree(refuse_links(run_dir / WORK, out))


def run_sweep(req: SweepRequest, *, progress: bool = True) -> list[Job]:
    """Run (or resume) a sweep; returns the jobs (status done / failed / todo = left to other processes)."""
    return Sweep(req, progress=progress).run()
