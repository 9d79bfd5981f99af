"""Streamed inference of one suite config to a predictions file, resumable.

The data path: the config's parquet row groups are the streaming units; DataLoader workers read
a unit, decode its JPEGs and apply timm's eval transform; the main process packs units into model
batches of ``batch_size``, runs the forward pass under ``torch.inference_mode`` (optionally
channels-last, ``torch.compile`` and AMP on GPU), and checkpoints finished units. Memory is bounded
by (workers x prefetch x unit size) whatever the suite size.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from genshift.errors import BenchError, one_line
from genshift.oom import BatchBackoff
from genshift.pixels import check_size, size_of, to_rgb
from genshift.reader import LocalSuite, RowGroup, read_row_group
from genshift.eval.predictions import CARRIED_COLUMNS, CheckpointedPredictions, PredictionBlock, schema

log = logging.getLogger(__name__)
# torch.compile pays off above roughly this many images on CPU (docs/performance.md, "compile").
COMPILE_MIN_IMAGES = 4000


@dataclass(frozen=True)
class InferenceOptions:
    """How to run the model. Options that can change predictions are part of the config hash."""

    batch_size: int | None = None     # None: 8 on CPU (small batches are fastest there), 256 on CUDA
    workers: int | None = None        # None: min(4, cpus - 1)
    device: str = "cpu"
    amp: bool = False                 # autocast (CUDA, or bf16 on CPU: the GPU numerics path, testable anywhere)
    amp_dtype: str = "bfloat16"
    channels_last: bool = True
    compile: str = "auto"             # "auto" | "on" | "off"
    topk: int = 10
    limit_per_class: int | None = None
    skip_bad_images: bool = False
    unit_rows: int = 200              # checkpoint granularity: units are whole batches of >= this many rows
    normalize_on_device: bool | None = None  # None: on for CUDA (workers ship uint8, as timm's prefetcher)
    cudnn_benchmark: bool = True      # CUDA only; recorded in the result's environment
    decode: str = "cpu"               # "cpu": PIL in the workers; "device": torchvision.io.decode_jpeg batches
    cpu_threads: int = 1              # torch intra-op threads of each process: CPU kernels' reduction order
                                      # (so the bytes) depends on it; fixed, recorded, part of the resume key
    forward_threads: int | None = None  # CPU: batches in flight at once, each at cpu_threads (None: the
                                        # process's share of the cores); bytes do not depend on it

    def device_normalizes(self) -> bool:
        if self.decode == "device":  # decoded on the device as uint8: it normalises too
            return True
        return self.device.startswith("cuda") if self.normalize_on_device is None else self.normalize_on_device

    def resolved_batch_size(self) -> int:
        if self.batch_size is not None:
            return self.batch_size
        return 256 if self.device.startswith("cuda") else 8

    def resolved_workers(self) -> int:
        if self.workers is not None:
            return self.workers
        return max(1, min(4, (os.cpu_count() or 2) - 1))

    def resolved_forward_threads(self, *, compiled: bool = False) -> int:
        """Batches of one model computed at once on CPU threads, each at ``cpu_threads`` intra-op
        threads: a batch's kernels, so its bytes, are those of a one-thread run (a GPU runs one stream).
        A compiled model runs one batch at a time: a package's call holds the GIL for the whole
        forward, so batches on threads would queue behind it (docs/performance.md, "forward threads")."""
        if not self.device.startswith("cpu") or compiled:
            return 1
        if self.forward_threads is not None:
            return self.forward_threads
        return max(1, min(16, process_cores() // self.cpu_threads))


def process_cores() -> int:
    """The cores this process may use: its CPU affinity, shared by the processes of one node under
    ``torchrun``/``accelerate launch`` (``LOCAL_WORLD_SIZE``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


@dataclass(frozen=True)
class Unit:
    """A contiguous run of the config's (selected) rows: a whole number of model batches.

    Batches never span units, so a resumed run forms exactly the batches of an uninterrupted
    one and its predictions are bit-identical.
    """

    index: int
    rows: tuple[tuple[int, int], ...]  # (row-group index in the config, row within the group)


@dataclass
class ConfigStats:
    rows: int = 0
    skipped_bad: list[str] = field(default_factory=list)
    seconds: float = 0.0
    model_seconds: float = 0.0
    compiled: bool = False
    resumed_units: int = 0

    @property
    def images_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def plan_units(suite: LocalSuite, config: str, *, batch_size: int, unit_rows: int = 200,
               limit_per_class: int | None = None) -> tuple[list[RowGroup], list[Unit]]:
    """Row groups of a config and its streaming units; with ``limit_per_class`` the first N ids per class."""
    groups = suite.row_groups(config)
    positions = [(g, r) for g, grp in enumerate(groups) for r in range(grp.num_rows)]
    if limit_per_class:
        meta = suite.read_columns(config, ["image_id", "label"])
        ids = meta["image_id"].to_pylist()
        labels = meta["label"].to_numpy()
        chosen: set[int] = set()
        per_class: dict[int, int] = {}
        for pos in sorted(range(len(ids)), key=ids.__getitem__):
            c = int(labels[pos])
            if per_class.get(c, 0) < limit_per_class:
                per_class[c] = per_class.get(c, 0) + 1
                chosen.add(pos)
        positions = [p for i, p in enumerate(positions) if i in chosen]
    size = batch_size * max(1, -(-unit_rows // batch_size))
    units = [Unit(i, tuple(positions[a:a + size])) for i, a in enumerate(range(0, len(positions), size))]
    return groups, units


class UnitDataset(torch.utils.data.Dataset):
    """Map-style dataset: item i = the decoded, transformed images of unit i (run in workers)."""

    def __init__(self, root: Path, groups: list[RowGroup], units: list[Unit], transform,
                 carried: tuple[str, ...]) -> None:
        # transform None: ship the encoded bytes (``--decode device`` decodes them in the main process)
        self.root, self.groups, self.units, self.transform, self.carried = root, groups, units, transform, carried

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i: int) -> dict:
        from PIL import Image

        start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across the worker and the main process
        unit = self.units[i]
        cols = ["image", "image_id", "label", "keep", "pair_id", *self.carried]
        parts = {}
        for g in dict.fromkeys(g for g, _ in unit.rows):
            parts[g] = read_row_group(self.root, self.groups[g], columns=cols)
        meta: dict[str, list] = {c: [] for c in cols if c != "image"}
        tensors, bad = [], []
        for g, r in unit.rows:
            row = {c: parts[g][c][r].as_py() for c in cols}
            if self.transform is None:
                tensors.append(torch.frombuffer(bytearray(row["image"]["bytes"]), dtype=torch.uint8))
                for c in meta:
                    meta[c].append(row[c])
                continue
            try:
                with Image.open(io.BytesIO(row["image"]["bytes"])) as im:
                    tensors.append(self.transform(to_rgb(im)))
            except Exception as e:  # noqa: BLE001 - reported per image id in the main process
                bad.append((row["image_id"], f"{type(e).__name__}: {e}"))
                continue
            for c in meta:
                meta[c].append(row[c])
        x = tensors if self.transform is None else torch.stack(tensors) if tensors else torch.empty(0)
        return {"unit": unit.index, "x": x, "meta": meta, "bad": bad,
                "decoded": (start, time.perf_counter(), os.getpid())}


class DeviceDecoder:
    """``--decode device``: JPEG batches decoded by ``torchvision.io.decode_jpeg`` on the device, then
    timm's eval geometry (shorter side to ``floor(size / crop_pct)``, centre crop) as tensor ops.

    Pixels differ slightly from PIL's decode and resize (another IDCT and antialiased tensor
    resize), so the choice is recorded in the result's protocol. Non-JPEG images are decoded on
    the CPU by PIL through ``genshift.pixels.to_rgb``, as the default path does. Output: uint8 NCHW on the device (the model's
    forward normalises it).
    """

    def __init__(self, data_config: dict, device: str) -> None:
        import math

        from torchvision.transforms import InterpolationMode

        if data_config.get("crop_mode", "center") not in (None, "center"):
            raise BenchError(f"--decode device supports timm's 'center' crop mode only, this model uses "
                             f"{data_config['crop_mode']!r}; use --decode cpu")
        _, h, w = data_config["input_size"]
        crop_pct = data_config.get("crop_pct") or 0.875
        self.size = (h, w)
        self.scale = (math.floor(h / crop_pct), math.floor(w / crop_pct))
        interp = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
                  "nearest": InterpolationMode.NEAREST}
        self.interpolation = interp.get(data_config.get("interpolation"), InterpolationMode.BILINEAR)
        self.device = torch.device(device)

    def __call__(self, datas: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        from PIL import Image
        from torchvision.io import ImageReadMode, decode_jpeg
        from torchvision.transforms.v2 import functional as F

        is_jpeg = [bool(d.numel() > 2 and d[0] == 0xFF and d[1] == 0xD8) for d in datas]
        images: list[torch.Tensor | None] = [None] * len(datas)
        bad: list[tuple[int, str]] = []
        jpeg_idx = []
        for i in (i for i, j in enumerate(is_jpeg) if j):
            try:  # sides from the header, before the device allocates them (genshift.pixels bounds)
                check_size(size_of(datas[i].numpy().tobytes()))
                jpeg_idx.append(i)
            except Exception as e:  # noqa: BLE001 - this image's, named
                bad.append((i, f"{type(e).__name__}: {e}"))
        if jpeg_idx:
            try:
                out = decode_jpeg([datas[i] for i in jpeg_idx], mode=ImageReadMode.RGB, device=self.device)
                for i, im in zip(jpeg_idx, out):
                    images[i] = im
            except RuntimeError:  # one bad file fails the batch: decode one by one to name it
                for i in jpeg_idx:
                    try:
                        images[i] = decode_jpeg(datas[i], mode=ImageReadMode.RGB, device=self.device)
                    except RuntimeError as e:
                        bad.append((i, f"RuntimeError: {e}"))
        for i, j in enumerate(is_jpeg):
            if not j:  # other formats: decoded on the CPU exactly as the default path does (genshift.pixels)
                try:
                    with Image.open(io.BytesIO(datas[i].numpy().tobytes())) as im:
                        rgb = np.asarray(to_rgb(im))
                    images[i] = torch.from_numpy(rgb.copy()).permute(2, 0, 1).to(self.device)
                except Exception as e:  # noqa: BLE001 - any decoder failure is this image's, named
                    bad.append((i, f"{type(e).__name__}: {e}"))
        out = []
        for im in images:
            if im is None:
                continue
            if self.scale[0] == self.scale[1]:
                im = F.resize(im, [self.scale[0]], interpolation=self.interpolation, antialias=True)
            else:  # timm's ResizeKeepRatio for non-square targets: the shorter side to its target
                ratio = max(self.scale[0] / im.shape[-2], self.scale[1] / im.shape[-1])
                im = F.resize(im, [round(im.shape[-2] * ratio), round(im.shape[-1] * ratio)],
                              interpolation=self.interpolation, antialias=True)
            out.append(F.center_crop(im, list(self.size)))
        x = torch.stack(out) if out else torch.empty(0, 3, *self.size, dtype=torch.uint8, device=self.device)
        return x, sorted(bad)


def make_transform(data_config: dict, *, uint8: bool):
    """timm's eval transform for a resolved data config; ``uint8=True`` stops before normalisation
    (timm's prefetcher variant: the device normalises, the workers ship 4x fewer bytes)."""
    from timm.data import create_transform

    cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data_config.items()}
    return create_transform(**cfg, is_training=False, use_prefetcher=uint8)


def _cpu_freezing(device: torch.device) -> None:
    if device.type == "cpu":
        # weights as constants: conv-bn folding + prepacked kernels, ~25% faster on CPU
        # (docs/performance.md); process-wide, fine for an inference-only process
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True


def wants_compile(model: torch.nn.Module, opts: InferenceOptions, *, n_images: int,
                  data_config: dict | None = None) -> bool:
    """``--compile``: on; off; auto = when the run pays back a cold compile or a compiled package of
    this model at this batch shape is already on the machine (genshift.eval.compile_cache)."""
    if opts.compile != "auto":
        return opts.compile == "on"
    if opts.resolved_forward_threads() > 1:
        # eager batches side by side use every core at the same bytes; a compiled forward holds the GIL,
        # so it runs on one core: on two cores they are even, beyond that eager wins (docs/performance.md)
        return False
    if n_images >= COMPILE_MIN_IMAGES:
        return True
    if opts.amp or not data_config or "input_size" not in data_config:
        return False
    from genshift.eval.compile_cache import cached

    example = torch.zeros(opts.resolved_batch_size(), *data_config["input_size"], device=opts.device)
    if opts.channels_last:
        example = example.contiguous(memory_format=torch.channels_last)
    return cached(model, example)


class Forward:
    """The model's forward pass as configured: channels-last, compile, AMP, top-k + true class."""

    def __init__(self, model: torch.nn.Module, opts: InferenceOptions, *, n_images: int,
                 data_config: dict | None = None, compile: bool | None = None) -> None:
        """``compile``: a decision already made (a sweep's job state, so a resumed run keeps its numerics);
        None decides here with ``wants_compile``."""
        self.device = torch.device(opts.device)
        self.norm = None
        if opts.device_normalizes():
            mean = torch.tensor(data_config["mean"], device=self.device).view(1, 3, 1, 1) * 255
            std = torch.tensor(data_config["std"], device=self.device).view(1, 3, 1, 1) * 255
            self.norm = (mean, std)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = opts.cudnn_benchmark
        self.topk = opts.topk
        self.batch_size = opts.resolved_batch_size()
        self.cpu_threads = opts.cpu_threads
        self.thread_ids: set[int] = set()  # threads that ran a batch: the evidence --forward-threads ran
        self._lock = threading.Lock()
        self.amp_dtype = getattr(torch, opts.amp_dtype) if opts.amp else None
        self.channels_last = opts.channels_last
        model = model.to(self.device).eval()
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.compiled = False
        self.compile_info: dict = {"mode": "eager"}
        self._aot = None  # (batch size, compiled fn) once the ahead-of-time package is loaded
        self._compile_opt = opts.compile
        self.eager = model
        if compile if compile is not None else wants_compile(model, opts, n_images=n_images, data_config=data_config):
            if self.amp_dtype is None:
                # ahead of time, once per machine (genshift.eval.compile_cache); built or loaded on the first batch,
                # whose padded shape is the package's shape
                self.compiled = True
                self.compile_info = {"mode": "aot"}
            else:  # autocast regions do not export: the JIT compiler (inductor's own caches apply)
                model = self._jit(model, opts)
        self.model = model
        self.threads = opts.resolved_forward_threads(compiled=self.compiled)
        self.seconds = 0.0

    def _jit(self, model: torch.nn.Module, opts: InferenceOptions) -> torch.nn.Module:
        try:
            _cpu_freezing(self.device)
            model = torch.compile(model, dynamic=False)
            self.compiled = True
            self.compile_info = {"mode": "jit"}
        except Exception as e:  # noqa: BLE001 - compile is an optimisation; eager is always correct
            if opts.compile == "on":
                raise BenchError(f"torch.compile failed ({type(e).__name__}: {e}); rerun with --compile off") from None
            log.warning("torch.compile unavailable (%s); running eager", e)
        return model

    def _aot_model(self, x: torch.Tensor):
        """The ahead-of-time compiled model for ``x``'s shape (one package per batch size, e.g. after OOM back-off)."""
        if self._aot is not None and self._aot[0] == x.shape[0]:
            return self._aot[1]
        from genshift.eval.compile_cache import load_or_compile

        try:
            with torch.inference_mode(False):  # export traces ordinary tensors, not inference-mode ones
                got = load_or_compile(self.eager, x.clone())
        except Exception as e:  # noqa: BLE001 - compile is an optimisation; eager is always correct
            if self._compile_opt == "on":
                raise BenchError(f"ahead-of-time compile failed ({type(e).__name__}: {one_line(e, 200)}); "
                                 "rerun with --compile off") from None
            log.warning("ahead-of-time compile unavailable (%s: %s); running eager", type(e).__name__, one_line(e, 200))
            self.compiled, self.compile_info, self.model = False, {"mode": "eager"}, self.eager
            return self.eager
        self.compile_info = {"mode": "aot", "source": got.source, "seconds": round(got.seconds, 3), "key": got.key}
        log.info("model compiled ahead of time (%s, %.2f s)", got.source, got.seconds)
        self._aot = (x.shape[0], got.fn)
        return got.fn

    @torch.inference_mode()
    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, ...]:
        n = x.shape[0]
        if self.compiled and n < self.batch_size:  # fixed shapes: pad the last batch, no recompile
            x = torch.cat([x, x[-1:].expand(self.batch_size - n, *x.shape[1:])])
        x = x.to(self.device, non_blocking=True)
        if self.norm is not None:
            x = x.float().sub_(self.norm[0]).div_(self.norm[1])
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        model = self._aot_model(x) if self.compile_info["mode"] == "aot" else self.model  # compile time is not model time
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            logits = model(x)
        probs = logits[:n].float().softmax(dim=-1)
        labels = labels.to(self.device)
        top_i, top_p, true_p, true_rank = rank_classes(probs, labels, self.topk)
        out = tuple(t.cpu().numpy() for t in (top_i, top_p, true_p, true_rank))
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        with self._lock:
            self.seconds += time.perf_counter() - start  # summed over the threads that ran batches
            self.thread_ids.add(threading.get_ident())
        return out

    def map(self, x: torch.Tensor, labels: torch.Tensor) -> list[tuple[np.ndarray, ...]]:
        """The batches of ``x`` (``batch_size`` rows each, in order), up to ``threads`` of them at once.

        Each batch is the same forward pass at ``cpu_threads`` intra-op threads whichever thread runs it,
        so the bytes equal a one-thread run's; two cores then compute two batches where one intra-op
        team of two would change the reduction order (docs/performance.md, "forward threads")."""
        spans = [(a, min(a + self.batch_size, x.shape[0])) for a in range(0, x.shape[0], self.batch_size)]

        def one(span: tuple[int, int]) -> tuple[np.ndarray, ...]:
            return self(x[span[0]:span[1]], labels[span[0]:span[1]])

        if self.threads == 1:  # also every compiled model (resolved_forward_threads)
            return [one(s) for s in spans]
        return list(_pool(self.threads, self.cpu_threads).map(one, spans))


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}


def _pool(threads: int, cpu_threads: int) -> ThreadPoolExecutor:
    """One pool per (threads, intra-op threads) for the process: its threads run torch at ``cpu_threads``."""
    key = (threads, cpu_threads)
    if key not in _POOLS:
        _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="forward", initializer=torch.set_num_threads,
                                         initargs=(cpu_threads,))
    return _POOLS[key]


def rank_classes(probs: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Top-k classes and the true class's rank from one ordering of the classes: probability
    descending, ties by lower class index (a stable sort). ``true_rank`` is the true class's
    position in that order, so ``true_rank < k`` exactly when the label is in the stored top-k, for
    every k, and a tie (frequent under bf16) never counts in the true class's favour:
    rank = #{c : p_c > p_y} + #{c < y : p_c = p_y}.
    Returns ``(topk_idx, topk_prob, true_prob, true_rank)``."""
    values, order = probs.sort(dim=-1, descending=True, stable=True)
    true_rank = (order == labels[:, None]).int().argmax(dim=1)
    true_p = probs.gather(1, labels[:, None])[:, 0]
    return order[:, :k], values[:, :k], true_p, true_rank


def _block(meta: dict, outs: list[tuple[np.ndarray, ...]], carried: tuple[str, ...], k: int) -> PredictionBlock:
    n = len(meta["image_id"])
    top_i, top_p, true_p, rank = (np.concatenate([o[j] for o in outs]) if outs else np.empty(0) for j in range(4))
    return PredictionBlock(
        image_id=meta["image_id"], label=np.asarray(meta["label"]), keep=np.asarray(meta["keep"], dtype=bool),
        pair_id=meta["pair_id"], topk_idx=top_i.reshape(n, k), topk_prob=top_p.reshape(n, k),
        true_prob=true_p, true_rank=rank, carried={c: meta[c] for c in carried},
    )


@dataclass
class ModelFeed:
    """One model's share of a streamed config: its forward pass, OOM back-off and checkpoints.

    Several feeds share one decoded stream (a preprocessing group of a sweep): each unit is
    decoded and transformed once and handed to every feed that still needs it.
    """

    name: str
    forward: Forward
    ckpt: CheckpointedPredictions
    backoff: BatchBackoff
    todo: set[int]                       # units of this config the model still needs

    def run(self, x: torch.Tensor, labels: torch.Tensor) -> list[tuple[np.ndarray, ...]]:
        def fn(idx: range) -> list:
            self.forward.batch_size = self.backoff.batch_size  # compiled graphs pad to the current size
            return self.forward.map(x[idx.start:idx.stop], labels[idx.start:idx.stop])
        # one batch per call on a GPU (an OOM re-runs that batch); the whole unit on CPU threads
        per_call = 1 if self.forward.threads == 1 else -(-x.shape[0] // self.backoff.batch_size)
        out = self.backoff.call(fn, range(x.shape[0]), batches_per_call=per_call) if x.shape[0] else []
        self.ckpt.batch_size = self.backoff.batch_size
        return out


def unit_loader(suite: LocalSuite, groups: list[RowGroup], units: list[Unit], transform, carried: tuple[str, ...],
                opts: InferenceOptions):
    """DataLoader over ``units`` (workers decode and transform; pinned memory on CUDA)."""
    workers = opts.resolved_workers()
    return torch.utils.data.DataLoader(
        UnitDataset(suite.root, groups, units, transform, carried), batch_size=None, shuffle=False,
        num_workers=workers, prefetch_factor=2 if workers else None, pin_memory=opts.device.startswith("cuda"),
        collate_fn=lambda item: item,
    )


@dataclass
class UnitStream:
    """Units of one config being decoded for one data config: the DataLoader's iterator (its workers
    start decoding, ``prefetch_factor`` units each, as soon as it exists), the device decoder for
    ``--decode device``, and when it started. A sweep starts the next group's stream while the
    current group still runs, so its first units are decoded by the time its models start."""

    units: frozenset[int]
    batches: object
    decoder: DeviceDecoder | None
    started: float


def start_stream(suite: LocalSuite, groups: list[RowGroup], units: list[Unit], data_config: dict,
                 opts: InferenceOptions) -> UnitStream:
    """Start decoding ``units`` now (see ``UnitStream``)."""
    carried = tuple(c for c in CARRIED_COLUMNS if c in suite.manifest.features)
    decoder = DeviceDecoder(data_config, opts.device) if opts.decode == "device" else None
    transform = None if decoder else make_transform(data_config, uint8=opts.device_normalizes())
    started = time.perf_counter()
    return UnitStream(frozenset(u.index for u in units),
                      iter(unit_loader(suite, groups, units, transform, carried, opts)), decoder, started)


def predict_units(suite: LocalSuite, config: str, feeds: list[ModelFeed], units: list[Unit], groups: list[RowGroup],
                  data_config: dict, opts: InferenceOptions, *, on_failure=None, on_unit=None,
                  timeline: list | None = None, stream: UnitStream | None = None) -> None:
    """Decode each of ``units`` once and run it through every feed that needs it.

    A feed whose model raises is handed to ``on_failure(feed, exc)`` (and dropped) when given, so
    one broken model does not stop the others; without it the error propagates. ``on_unit(rows,
    n_models)`` reports progress. ``timeline`` (a list) receives one ``genshift.eval.busy`` event per unit:
    when the loader started, when the unit was decoded, how long the models waited for it, and
    each model's forward span (perf_counter seconds). ``stream``: the same units' decode, started
    earlier with ``start_stream`` (it may hold units no feed needs any more: they are skipped).
    """
    carried = tuple(c for c in CARRIED_COLUMNS if c in suite.manifest.features)
    live = list(feeds)
    wanted = [u for u in units if any(u.index in f.todo for f in live)]
    if stream is not None and not {u.index for u in wanted} <= stream.units:
        raise BenchError(f"config {config!r}: the stream started for it lacks units the models need")  # a bug
    try:
        stream = stream or start_stream(suite, groups, wanted, data_config, opts)
        decoder, started, it = stream.decoder, stream.started, stream.batches
        while live:
            asked = time.perf_counter()
            item = next(it, None)
            if item is None:
                break
            event = {"config": config, "unit": item["unit"], "loader_started": started, "decoded": item["decoded"],
                     "waited": (asked, time.perf_counter()), "forward": {}}
            if decoder is not None:
                item["x"], failed = decoder(item["x"])
                drop = {i for i, _ in failed}
                item["bad"] = [(item["meta"]["image_id"][i], err) for i, err in failed]
                item["meta"] = {c: [v for i, v in enumerate(vals) if i not in drop] for c, vals in item["meta"].items()}
            bad = []
            for image_id, err in item["bad"]:
                if not opts.skip_bad_images:
                    raise BenchError(f"image {image_id!r} of config {config!r} does not decode ({err}); fix the suite "
                                     "or pass --skip-bad-images to skip and count such images")
                bad.append(image_id)
            labels = torch.tensor(item["meta"]["label"], dtype=torch.long)
            served = 0
            for feed in list(live):
                if item["unit"] not in feed.todo:
                    continue
                before, span_start = feed.forward.seconds, time.perf_counter()
                try:
                    outs = feed.run(item["x"], labels)
                    event["forward"][feed.name] = (span_start, time.perf_counter())
                    feed.ckpt.add(item["unit"], _block(item["meta"], outs, carried, opts.topk), skipped_bad=bad,
                                  model_seconds=feed.forward.seconds - before,
                                  threads_used=len(feed.forward.thread_ids))
                except Exception as e:  # noqa: BLE001 - recorded for this model; the others go on
                    if on_failure is None:
                        raise
                    live.remove(feed)
                    on_failure(feed, e)
                    continue
                feed.todo.discard(item["unit"])
                served += 1
            if timeline is not None:
                timeline.append(event)
            if on_unit:
                on_unit(len(item["meta"]["image_id"]) + len(item["bad"]), served)
    finally:
        for feed in feeds:
            feed.ckpt.flush()


def predict_config(suite: LocalSuite, config: str, model: torch.nn.Module, data_config: dict, opts: InferenceOptions,
                   *, work_dir: Path, out_path: Path, progress: bool = True) -> ConfigStats:
    """Predict every (selected) image of ``config`` with one model and write ``out_path``; resumes from
    ``work_dir`` (the one-model case of ``predict_units``, kept for the throughput benchmark)."""
    carried = tuple(c for c in CARRIED_COLUMNS if c in suite.manifest.features)
    ckpt = CheckpointedPredictions(work_dir, config, schema(opts.topk, carried))
    groups, units = plan_units(suite, config, batch_size=opts.resolved_batch_size(), unit_rows=opts.unit_rows,
                               limit_per_class=opts.limit_per_class)
    todo = {u.index for u in units} - ckpt.done_units
    stats = ConfigStats(resumed_units=len(units) - len(todo))
    start = time.perf_counter()
    forward = Forward(model, opts, n_images=sum(len(u.rows) for u in units), data_config=data_config)
    feed = ModelFeed(config, forward, ckpt, BatchBackoff(opts.resolved_batch_size(), what="eval batch"), todo)
    predict_units(suite, config, [feed], units, groups, data_config, opts)
    stats.compiled = forward.compiled
    stats.skipped_bad = [i for info in ckpt.part_info() for i in info.get("skipped_bad", [])]
    stats.rows = ckpt.finish(out_path)
    stats.seconds = time.perf_counter() - start
    stats.model_seconds = forward.seconds
    return stats


def check_device(device: str) -> str:
    """Validate ``--device``: ``cpu``, ``cuda`` or ``cuda:N`` that exists."""
    if device == "cpu":
        return device
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise BenchError(f"--device {device} requested but CUDA is not available here; use --device cpu")
        idx = device.partition(":")[2]
        if idx and int(idx) >= torch.cuda.device_count():
            raise BenchError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) present")
        return device
    raise BenchError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
