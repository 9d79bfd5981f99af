"""Streamed, resumable inference: DataLoader workers decode and transform a unit of rows, the main
process runs it through every model that needs it in batches of ``batch_size`` and checkpoints it.
Memory is bounded by (workers x prefetch x unit size) whatever the suite size.
"""

from __future__ import annotations

import io
import logging
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from genshift.errors import BenchError, one_line
from genshift.eval.merging import CheckpointedPredictions
from genshift.eval.options import EvalOptions, OptionError
from genshift.eval.predictions import CARRIED_COLUMNS, PredictionBlock, first_per_class
from genshift.oom import BatchBackoff
from genshift.pixels import check_size, size_of, to_rgb
from genshift.suite_format import LocalSuite, RowGroup, read_row_group

log = logging.getLogger(__name__)
COMPILE_MIN_IMAGES = 4000  # compile auto: runs of this many images pay a cold compile back on a GPU


@dataclass(frozen=True)
class Unit:
    """A run of the config's (selected) rows, a whole number of batches: batches never span units, so
    a resumed run forms exactly the batches of an uninterrupted one (bit-identical predictions)."""

    index: int
    rows: tuple[tuple[int, int], ...]  # (row-group index in the config, row within the group)


def plan_units(suite: LocalSuite, config: str, *, batch_size: int, unit_rows: int = 200,
               limit_per_class: int | None = None) -> tuple[list[RowGroup], list[Unit]]:
    """Row groups of a config and its streaming units; with ``limit_per_class`` the first N ids per class."""
    groups = suite.row_groups(config)
    positions = [(g, r) for g, grp in enumerate(groups) for r in range(grp.num_rows)]
    if limit_per_class:
        meta = suite.read_columns(config, ["image_id", "label"])
        ids = meta["image_id"].to_pylist()
        chosen = first_per_class(ids, meta["label"].to_pylist(), limit_per_class)
        positions = [p for p, i in zip(positions, ids) if i in chosen]
    size = batch_size * max(1, -(-unit_rows // batch_size))
    units = [Unit(i, tuple(positions[a:a + size])) for i, a in enumerate(range(0, len(positions), size))]
    return groups, units


class UnitDataset(torch.utils.data.Dataset):
    """Map-style dataset: item i = the decoded, transformed images of unit i (run in workers)."""

    def __init__(self, root: Path, groups: list[RowGroup], units: list[Unit], transform,
                 carried: tuple[str, ...]) -> None:
        # transform None: ship the encoded bytes (decode="device" decodes them in the main process)
        self.root, self.groups, self.units, self.transform, self.carried = root, groups, units, transform, carried

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i: int) -> dict:
        unit = self.units[i]
        cols = ["image", "image_id", "label", "keep", "pair_id", *self.carried]
        parts = {g: read_row_group(self.root, self.groups[g], columns=cols) for g in {g for g, _ in unit.rows}}
        meta: dict[str, list] = {c: [] for c in cols if c != "image"}
        tensors, bad = [], []
        for g, r in unit.rows:
            row = {c: parts[g][c][r].as_py() for c in cols}
            if self.transform is None:
                tensors.append(torch.frombuffer(bytearray(row["image"]["bytes"]), dtype=torch.uint8))
            else:
                try:
                    with Image.open(io.BytesIO(row["image"]["bytes"])) as im:
                        tensors.append(self.transform(to_rgb(im)))
                except Exception as e:  # noqa: BLE001 - reported per image id in the main process
                    bad.append((row["image_id"], f"{type(e).__name__}: {e}"))
                    continue
            for c in meta:
                meta[c].append(row[c])
        x = tensors if self.transform is None else torch.stack(tensors) if tensors else torch.empty(0)
        return {"unit": unit.index, "x": x, "meta": meta, "bad": bad}


class DeviceDecoder:
    """``decode="device"``: JPEG batches decoded by ``torchvision.io.decode_jpeg`` on the device, then
    timm's eval geometry (shorter side to ``floor(size / crop_pct)``, centre crop) as tensor ops;
    other formats decoded as the default path does. Output: uint8 NCHW on the device. Pixels differ
    slightly from PIL's, so the choice is recorded in the protocol."""

    def __init__(self, data_config: dict, device: str) -> None:
        if data_config.get("crop_mode", "center") not in (None, "center"):
            raise OptionError("decode", f"decode=device supports timm's 'center' crop mode only, this model uses "
                             f"{data_config['crop_mode']!r}; use decode=cpu")
        _, h, w = data_config["input_size"]
        crop_pct = data_config.get("crop_pct") or 0.875
        self.size = (h, w)
        self.scale = (math.floor(h / crop_pct), math.floor(w / crop_pct))
        interp = data_config.get("interpolation")
        self.interpolation = InterpolationMode(interp if interp in ("bicubic", "bilinear", "nearest") else "bilinear")
        self.device = torch.device(device)

    def __call__(self, datas: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        images, bad, jpegs = {}, [], []  # position -> decoded image; (position, error); positions of JPEGs
        for i, d in enumerate(datas):
            try:
                if d.numel() > 2 and d[0] == 0xFF and d[1] == 0xD8:
                    check_size(size_of(d.numpy().tobytes()))  # sides from the header, before the device allocates
                    jpegs.append(i)
                else:  # other formats: decoded on the CPU exactly as the default path does (genshift.pixels)
                    with Image.open(io.BytesIO(d.numpy().tobytes())) as im:
                        images[i] = F.pil_to_tensor(to_rgb(im)).to(self.device)
            except Exception as e:  # noqa: BLE001 - any decoder failure is this image's, named
                bad.append((i, f"{type(e).__name__}: {e}"))
        try:
            if jpegs:
                images.update(zip(jpegs, decode_jpeg([datas[i] for i in jpegs], mode=ImageReadMode.RGB,
                                                     device=self.device)))
        except RuntimeError:  # one bad file fails the batch: decode one by one to name it
            for i in jpegs:
                try:
                    images[i] = decode_jpeg(datas[i], mode=ImageReadMode.RGB, device=self.device)
                except RuntimeError as e:
                    bad.append((i, f"RuntimeError: {e}"))
        out = []
        for _, im in sorted(images.items()):
            # a square target: the shorter side to it; else timm's ResizeKeepRatio (each side at least its target)
            ratio = max(self.scale[0] / im.shape[-2], self.scale[1] / im.shape[-1])
            size = [self.scale[0]] if self.scale[0] == self.scale[1] else [round(s * ratio) for s in im.shape[-2:]]
            im = F.resize(im, size, interpolation=self.interpolation, antialias=True)
            out.append(F.center_crop(im, list(self.size)))
        x = torch.stack(out) if out else torch.empty(0, 3, *self.size, dtype=torch.uint8, device=self.device)
        return x, sorted(bad)


def make_transform(data_config: dict, *, uint8: bool):
    """timm's eval transform for a resolved data config; ``uint8=True`` stops before normalisation
    (timm's prefetcher variant: the device normalises, the workers ship 4x fewer bytes)."""
    from timm.data import create_transform

    cfg = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data_config.items()}
    return create_transform(**cfg, is_training=False, use_prefetcher=uint8)


def wants_compile(opts: EvalOptions, *, n_images: int) -> bool:
    """``compile``: on; off; auto = on a GPU, for a run of ``COMPILE_MIN_IMAGES`` images or more (it
    pays back the compile there). Decided from the request alone, so the same request runs the same
    numerics anywhere; on a CPU, forward threads put the cores to work on eager batches instead."""
    if opts.compile != "auto":
        return opts.compile == "on"
    return opts.device.startswith("cuda") and n_images >= COMPILE_MIN_IMAGES


@contextmanager
def torch_state(opts: EvalOptions):
    """The process-wide torch settings a call runs with (intra-op threads; cuDNN autotuning on a GPU),
    put back as they were when it returns, and the environment too (inductor writes a variable
    into it while it compiles)."""
    threads, autotune, env = torch.get_num_threads(), torch.backends.cudnn.benchmark, dict(os.environ)
    torch.set_num_threads(opts.cpu_threads)
    if opts.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = opts.cudnn_benchmark
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.backends.cudnn.benchmark = autotune
        for name in set(os.environ) - set(env):
            del os.environ[name]
        os.environ.update({k: v for k, v in env.items() if os.environ.get(k) != v})


class Forward:
    """The model's forward pass as configured: channels-last, compile (decided for the whole workload,
    ``wants_compile``), AMP, top-k + true class. ``close()`` ends its forward threads."""

    def __init__(self, model: torch.nn.Module, opts: EvalOptions, *, compile: bool,
                 data_config: dict | None = None) -> None:
        self.device = torch.device(opts.device)
        self.norm = None  # (mean, std) on the 0..255 scale when the device normalises uint8 batches
        if opts.device_normalizes():
            self.norm = [torch.tensor(data_config[k], device=self.device).view(1, 3, 1, 1) * 255
                         for k in ("mean", "std")]
        self.topk = opts.topk
        self.batch_size = opts.resolved_batch_size()
        self.thread_ids: set[int] = set()  # threads that ran a batch: the evidence forward threads ran
        self._lock = threading.Lock()
        self.amp_dtype = getattr(torch, opts.amp_dtype) if opts.amp else None
        self.channels_last = opts.channels_last
        model = model.to(self.device).eval()
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.compiled = False
        if compile:
            try:
                # freezing (weights as constants: conv-bn folding, prepacked kernels) for this model only
                model = torch.compile(model, dynamic=False, options={"freezing": self.device.type == "cpu"})
                self.compiled = True
            except Exception as e:  # noqa: BLE001 - compile is an optimisation; eager is always correct
                if opts.compile == "on":
                    raise BenchError(f"torch.compile failed ({type(e).__name__}: {one_line(e, 200)}); set compile "
                                     "to off") from None
                log.warning("torch.compile unavailable (%s); running eager", one_line(e, 200))
        self.model = model
        self.threads = opts.resolved_forward_threads(compiled=self.compiled)
        self._pool = None
        if self.threads > 1:  # each thread runs torch at cpu_threads intra-op threads
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="forward",
                                            initializer=torch.set_num_threads, initargs=(opts.cpu_threads,))
        self.seconds = 0.0

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

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
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            logits = self.model(x)
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
        """The batches of ``x`` (``batch_size`` rows each, in order), up to ``threads`` at once, each at
        ``cpu_threads`` intra-op threads: a one-thread run's bytes (docs/performance.md, "Forward threads")."""
        spans = [(a, min(a + self.batch_size, x.shape[0])) for a in range(0, x.shape[0], self.batch_size)]

        def one(span: tuple[int, int]) -> tuple[np.ndarray, ...]:
            return self(x[span[0]:span[1]], labels[span[0]:span[1]])

        if self._pool is None:  # one thread: also every compiled model and every GPU
            return [one(s) for s in spans]
        return list(self._pool.map(one, spans))


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
    """One model's share of a streamed config (a preprocessing group's models share each decoded unit):
    its forward pass, OOM back-off and checkpoints."""

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


def predict_units(suite: LocalSuite, config: str, feeds: list[ModelFeed], units: list[Unit], groups: list[RowGroup],
                  data_config: dict, opts: EvalOptions, *, on_failure=None, on_unit=None, transform=None) -> None:
    """Decode each of ``units`` once and run it through every feed that needs it. A feed whose model
    raises goes to ``on_failure(feed, exc)`` and is dropped (without it the error propagates);
    ``on_unit(rows, n_models)`` reports progress; ``transform``: a module's own instead of timm's."""
    carried = tuple(c for c in CARRIED_COLUMNS if c in suite.manifest.features)
    live = list(feeds)
    wanted = [u for u in units if any(u.index in f.todo for f in live)]
    decoder = DeviceDecoder(data_config, opts.device) if opts.decode == "device" else None
    if decoder is None and transform is None:
        transform = make_transform(data_config, uint8=opts.device_normalizes())
    workers = opts.resolved_workers()
    loader = torch.utils.data.DataLoader(
        UnitDataset(suite.root, groups, wanted, transform, carried), batch_size=None, shuffle=False,
        num_workers=workers, prefetch_factor=2 if workers else None, pin_memory=opts.device.startswith("cuda"),
        collate_fn=lambda item: item)
    try:
        for item in loader:
            if not live:
                break
            if decoder is not None:
                item["x"], failed = decoder(item["x"])
                drop = {i for i, _ in failed}
                item["bad"] = [(item["meta"]["image_id"][i], err) for i, err in failed]
                item["meta"] = {c: [v for i, v in enumerate(vals) if i not in drop] for c, vals in item["meta"].items()}
            if item["bad"] and not opts.skip_bad_images:
                image_id, err = item["bad"][0]
                raise BenchError(f"image {image_id!r} of config {config!r} does not decode ({err}); fix the suite "
                                 "or set skip_bad_images to skip and count such images")
            bad = [image_id for image_id, _ in item["bad"]]
            labels = torch.tensor(item["meta"]["label"], dtype=torch.long)
            served = 0
            for feed in list(live):
                if item["unit"] not in feed.todo:
                    continue
                before = feed.forward.seconds
                try:
                    outs = feed.run(item["x"], labels)
                    feed.ckpt.add(item["unit"], _block(item["meta"], outs, carried, opts.topk), skipped_bad=bad,
                                  model_seconds=feed.forward.seconds - before,
                                  threads_used=len(feed.forward.thread_ids))
                    feed.todo.discard(item["unit"])
                    served += 1
                except Exception as e:  # noqa: BLE001 - recorded for this model; the others go on
                    if on_failure is None:
                        raise
                    live.remove(feed)
                    on_failure(feed, e)
            if on_unit:
                on_unit(len(item["meta"]["image_id"]) + len(item["bad"]), served)
    finally:
        for feed in feeds:
            feed.ckpt.flush()


def check_device(device: str) -> str:
    """``device`` (``cpu``, ``cuda`` or ``cuda:N``) if it exists here."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise OptionError("device", f"device {device} requested but CUDA is not available here; use cpu")
        idx = device.partition(":")[2]
        if idx and int(idx) >= torch.cuda.device_count():
            raise OptionError("device", f"device {device}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device
