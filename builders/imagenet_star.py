"""``bench build imagenet-star``: regenerate ImageNet* (Vendrow et al., Dataset Interfaces).

Pipeline (Vendrow et al. 2023): class tokens (the released ones by default, tokens trained
here with ``--train-tokens``, or the class names with ``--no-tokens``) -> Stable Diffusion 2 with
the shift prompts (Euler, 50 steps, guidance 7.5, 768 px, stored as 512 px JPEG) -> CLIP presence
scores -> ``keep`` (``genshift.builders.clip_filter``). Guide: ``docs/builders.md``.

Two phases, both resumable:

1. **generate** (every process of an ``accelerate launch``): work items (shift, class, sample) are
   grouped into shards by ``sha256(shift/class) mod shards``; shards are dealt round-robin to the
   processes; each image's seed derives from (suite seed, shift, class, sample); images are
   scored by CLIP and written shard by shard, atomically, to ``<out>/.stage/``. A rerun skips
   finished shards. Processes do not meet at a collective barrier afterwards (an hour-long
   imbalance would exceed NCCL's timeout): the others exit, the main process waits until every
   staged shard exists on the (shared) file system.
2. **filter** (main process): per shift, thresholds are calibrated on all of the shift's scores;
   the final shards are written to ``<out>/data/`` with ``keep`` set (JPEG bytes copied, never
   re-encoded), then the card and, last, the manifest.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import time
from pathlib import Path

from genshift.cli._common import csv_list, positive_int
from genshift.builders import determinism

log = logging.getLogger(__name__)
SUITE_ID = "imagenet-star"
STAGE = ".stage"
TOKENS_WORK = ".tokens"
SMOKE_CLASSES = [0, 207]  # tench, Golden Retriever (a name with a space and capitals)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="output suite folder (resumable; see --overwrite); required unless --preflight")
    p.add_argument("--overwrite", action="store_true", help="replace a different build in --out")
    p.add_argument("--smoke", action="store_true",
                   help="whole pipeline with tiny random models on CPU: 2 classes x 2 shifts x 2 samples")
    p.add_argument("--shifts", type=csv_list, help="shift keys (default: base + the 23 shifts)")
    p.add_argument("--shifts-file", help="YAML prompt table (list of {key, prompt, group, status}) to use instead")
    p.add_argument("--classes", type=csv_list, help="class indices or wnids, or a range like 0-99 (default: all 1000)")
    p.add_argument("--samples-per-class", type=positive_int, default=50, help="images generated per class and shift")
    p.add_argument("--images-per-shard", type=positive_int, default=2500, help="sets the number of shards per shift")
    p.add_argument("--num-shards", type=positive_int, help="shards per shift (overrides --images-per-shard)")
    p.add_argument("--seed", type=int, default=0, help="suite seed; every image's seed derives from it and its ids")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokens", default="hub",
                     help="class tokens: 'hub' (the released madrylab/imagenet-star-tokens tokens.zip, sha256-"
                          "checked), a tokens.zip / token folder, or 'none' (class names)")
    tok.add_argument("--train-tokens", metavar="DIR", help="train tokens by textual inversion on DIR/<wnid>/ images")
    tok.add_argument("--no-tokens", action="store_true", help="prompt with class names instead of tokens")
    p.add_argument("--ti-steps", type=positive_int, default=3000,
                   help="textual-inversion steps per class (--train-tokens)")
    p.add_argument("--ti-lr", type=float, default=5e-4, help="textual-inversion learning rate (--train-tokens)")
    p.add_argument("--model", default="stabilityai/stable-diffusion-2",
                   help="Stable Diffusion checkpoint (Hub repo) of the generator")
    p.add_argument("--model-revision", help="commit sha to pin (recommended; default: main, resolved sha recorded)")
    p.add_argument("--variant", default="fp16", help="Hub weight variant (fp16 = the authors' weights, half download)")
    p.add_argument("--steps", type=positive_int, default=50, help="diffusion steps per image")
    p.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale")
    p.add_argument("--height", type=positive_int, default=768, help="generated image height in pixels")
    p.add_argument("--width", type=positive_int, default=768, help="generated image width in pixels")
    p.add_argument("--output-size", type=positive_int, default=512,
                   help="stored image size in pixels (resized from the generated size)")
    p.add_argument("--jpeg-quality", type=int, default=75,
                   help="PIL's default, as the upstream release (~45-57 KB per 512 px image)")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="generator weights dtype")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per generation batch")
    p.add_argument("--device", help="default: cuda when available (each accelerate process gets its local GPU)")
    p.add_argument("--clip-model", default="ViT-H-14", help="open_clip architecture of the presence filter")
    p.add_argument("--clip-pretrained", default="laion2b_s32b_b79k", help="open_clip pretrained tag of --clip-model")
    p.add_argument("--keep-rule", choices=("class", "class+shift"), default="class",
                   help="class: class presence >= per-shift threshold; class+shift: also a shift-presence gate")
    p.add_argument("--shift-gate-quantile", type=float, default=0.1,
                   help="class+shift: fraction of each shift's images the shift-presence gate removes")
    p.add_argument("--kept-fractions", help="JSON {shift: fraction} targets (default: the released masks' fractions)")
    p.add_argument("--wait-timeout", type=float, default=4 * 3600,
                   help="multi-process: seconds the main process waits for a new staged shard before giving up")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    determinism.add_arguments(p)


def _parse_classes(items: list[str] | None) -> list[int]:
    from genshift import imagenet
    from genshift.errors import BenchError

    if not items:
        return list(range(imagenet.NUM_CLASSES))
    out = []
    for it in items:
        if "-" in it and it.replace("-", "").isdigit():
            a, b = (int(x) for x in it.split("-"))
            out += list(range(a, b + 1))
        elif it.isdigit():
            out.append(int(it))
        else:
            out.append(imagenet.index_of(it))
    bad = [c for c in out if not 0 <= c < imagenet.NUM_CLASSES]
    if bad:
        raise BenchError(f"--classes: {bad[0]} is not an ImageNet-1k class index (0..999)")
    return sorted(set(out))


def _shift_table(args) -> dict[str, str]:
    import yaml

    from genshift.errors import BenchError, unknown
    from genshift.suites import imagenet_star_shifts

    if args.shifts_file:
        try:
            rows = yaml.safe_load(Path(args.shifts_file).read_text())
            table = {r["key"]: r["prompt"] for r in rows}
        except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
            raise BenchError(f"--shifts-file {args.shifts_file!r}: expected a YAML list of {{key, prompt}} ({e})") from None
    else:
        table = {s.key: s.prompt for s in imagenet_star_shifts()}
    for key, prompt in table.items():
        if "<TOKEN>" not in prompt:
            raise BenchError(f"shift {key!r}: prompt {prompt!r} has no <TOKEN> placeholder")
    wanted = args.shifts or (["base", "in_the_snow"] if args.smoke else list(table))
    for s in wanted:
        if s not in table:
            raise unknown("shift", s, table)
    return {s: table[s] for s in wanted}


def _settings(args):
    from genshift.builders.sd_generate import GenerationSettings

    if args.smoke:
        return GenerationSettings(model_id="tiny-random-sd2(seed=0)", scheduler="euler", steps=2, guidance=args.guidance,
                                  height=64, width=64, output_size=32, jpeg_quality=args.jpeg_quality,
                                  dtype="float32", batch_size=min(args.batch_size, 4))
    return GenerationSettings(model_id=args.model, revision=args.model_revision, scheduler="euler", steps=args.steps,
                              guidance=args.guidance, height=args.height, width=args.width,
                              output_size=args.output_size, jpeg_quality=args.jpeg_quality, dtype=args.dtype,
                              batch_size=args.batch_size, variant=args.variant)


def _token_source(args) -> tuple[str, str | None]:
    """(kind, path or None) of the class tokens, resolved before anything heavy is loaded."""
    from genshift.builders.tokens import download_released_tokens

    if args.smoke:
        return "smoke", None
    if args.no_tokens or args.tokens == "none":
        return "none", None
    if args.train_tokens:
        return "trained", args.train_tokens
    if args.tokens == "hub":
        return "released", str(download_released_tokens())
    return "file", args.tokens


def _smoke_training_images(root: Path, classes: list[int]) -> Path:
    """Two tiny synthetic images per class (distinct colours), as ``<wnid>/<i>.png``."""
    import numpy as np
    from PIL import Image

    from genshift import imagenet

    rng = np.random.default_rng(0)
    for c in classes:
        d = root / imagenet.wnids()[c]
        d.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for i in range(2):
            arr = np.clip(colour + rng.normal(0, 12, (40, 48, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(arr).save(d / f"{i}.png")
    return root


def _train(args, run, classes: list[int], work: Path, data: str | Path, *, steps: int, lr: float, resolution: int,
           model_id: str, timeout: float):
    """Tokens of ``classes`` by textual inversion, split over the processes; every process gets all."""
    from genshift.distributed import current_process
    from genshift.builders.textual_inversion import TIConfig, folder_classes, train_tokens

    cfg = TIConfig(steps=steps, lr=lr, resolution=resolution)
    proc = current_process()
    tokens = train_tokens(data, work, run, cfg, classes=classes, model_id=model_id, process=proc,
                          progress=args.progress)
    if len(tokens) < len(classes):  # other processes train the rest: wait for their files
        _wait_for(lambda: [c for c in classes if not (work / f"{c}.bin").is_file()], "class token(s)", timeout)
        tokens = train_tokens(data, work, run, cfg, classes=classes, model_id=model_id, progress=False)
    used = [f for c in folder_classes(data, classes=classes) for f in c.files]
    return tokens, {"steps": steps, "lr": lr, "resolution": resolution, "model": model_id,
                    "data": determinism.files_digest(data, used),
                    "settings": "genshift.builders.textual_inversion.TIConfig defaults otherwise"}


def _load_models(args, settings, classes: list[int], device: str, out: Path, token_kind: str, token_path: str | None,
                 tokens: dict | None):
    """(generator, CLIP scorer, token provenance); ``tokens`` = the loaded released/file tokens."""
    from genshift.fsutil import sha256_file
    from genshift.builders.clip_scoring import ClipScorer
    from genshift.builders.sd_generate import SDGenerator
    from genshift.builders.textual_inversion import TIRun
    from genshift.builders.tokens import load_token_zip, save_token_zip, tokens_digest

    if token_kind == "smoke":  # a few textual-inversion steps on synthetic images, then the real token path
        from genshift.builders.tiny import tiny_sd_components

        data = _smoke_training_images(out / STAGE / "smoke-images", classes)
        run = TIRun.from_components(tiny_sd_components(), "cpu")
        tokens, ti = _train(args, run, classes, out / STAGE / TOKENS_WORK, data, steps=2, lr=5e-3, resolution=32,
                            model_id="tiny-random-sd2(seed=0)", timeout=args.wait_timeout)
        save_token_zip(tokens, out / STAGE / "tokens.zip")
        tokens = load_token_zip(out / STAGE / "tokens.zip", dim=None, classes=classes)
        info = {"tokens": "textual inversion on synthetic images (smoke)", "textual_inversion": ti,
                "tokens_sha256": sha256_file(out / STAGE / "tokens.zip")}
        return SDGenerator.tiny(settings, tokens=tokens), ClipScorer.tiny(), info
    info = {"tokens": None}
    if token_kind in ("released", "file"):
        info = {"tokens": "madrylab/imagenet-star-tokens tokens.zip" if token_kind == "released" else Path(token_path).name,
                "tokens_sha256": tokens_digest(token_path)}
    elif token_kind == "trained":
        base = SDGenerator.from_pretrained(settings, device=device)
        run = TIRun.from_components(base.pipe.components, device)
        tokens, ti = _train(args, run, classes, out / TOKENS_WORK, token_path, steps=args.ti_steps, lr=args.ti_lr,
                            resolution=args.height, model_id=settings.model_id, timeout=args.wait_timeout)
        del base, run
        save_token_zip(tokens, out / "tokens.zip")
        info = {"tokens": "trained here (tokens.zip)", "tokens_sha256": sha256_file(out / "tokens.zip"),
                "textual_inversion": ti}
    gen = SDGenerator.from_pretrained(settings, device=device, tokens=tokens)
    clip = ClipScorer.from_pretrained(args.clip_model, args.clip_pretrained, device=device)
    return gen, clip, info


def _features():
    from datasets import Sequence, Value

    return {"shift": Value("string"), "prompt": Value("string"), "class_token": Value("string"),
            "seed": Value("int64"), "sample": Value("int32"), "generator": Value("string"),
            "generator_revision": Value("string"), "scheduler": Value("string"), "steps": Value("int32"),
            "guidance": Value("float32"),
            "clip_class_score": Value("float32"), "clip_shift_score": Value("float32"),
            "clip_image_embedding": Sequence(Value("float32"))}


def _shard_rows(items, shift, prompt, gen, clip, args, token_names, progress_bar, record_batch_size):
    """Generate, score and yield the rows of one shard, in batches; then record the batch size
    (this runs before the shard's file is renamed into place)."""
    import io

    from PIL import Image

    from genshift import imagenet
    from genshift.builders.clip_filter import clip_scores
    from genshift.builders.seeding import derive_seed

    bs = gen.settings.batch_size
    fixed = {"generator": gen.settings.model_id, "generator_revision": gen.resolved_revision,
             "scheduler": type(gen.pipe.scheduler).__name__, "steps": gen.settings.steps,
             "guidance": gen.settings.guidance}
    for a in range(0, len(items), bs):
        chunk = items[a:a + bs]
        prompts = [prompt.replace("<TOKEN>", token_names[c]) for c, _ in chunk]
        seeds = [derive_seed(args.seed, shift, c, k) for c, k in chunk]
        jpegs = gen.generate(prompts, seeds)
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in jpegs]
        sc = clip_scores(clip, images, [imagenet.get_class(c).name for c, _ in chunk], [prompt] * len(chunk))
        for j, ((c, k), data) in enumerate(zip(chunk, jpegs)):
            yield {"image": {"bytes": data, "path": None}, "label": c,
                   "image_id": f"{shift}/{imagenet.wnids()[c]}/{k:02d}", "config": shift, "keep": True,
                   "pair_id": None, "shift": shift, "prompt": prompts[j], "class_token": token_names[c],
                   "seed": seeds[j], "sample": k, **fixed,
                   "clip_class_score": float(sc["class_score"][j]),
                   "clip_shift_score": None if sc["shift_score"][j] != sc["shift_score"][j] else float(sc["shift_score"][j]),
                   "clip_image_embedding": sc["embedding"][j].tolist()}
        if progress_bar is not None:
            progress_bar.update(len(chunk))
    record_batch_size(gen.backoff.batch_size)


def _plans(args, shifts, classes, samples) -> dict[str, list[list[int]]]:
    from genshift.distributed import plan_nonempty_shards

    target = args.num_shards or max(1, math.ceil(len(classes) * samples / args.images_per_shard))
    return {s: plan_nonempty_shards(classes, target, key=lambda c, s=s: f"{s}/{c}") for s in shifts}


def run(args) -> int:
    with determinism.fixed_threads(args.cpu_threads):
        return _run(args)


def _run(args) -> int:
    import torch  # noqa: F401 - fail early if the builder extras are missing
    from tqdm.auto import tqdm

    from genshift import imagenet
    from genshift.suite_format import MANIFEST
    from genshift.writer import SuiteWriter
    from genshift.distributed import current_process
    from genshift.builders.tokens import token_name

    shifts = _shift_table(args)
    classes = _parse_classes(args.classes) if not (args.smoke and not args.classes) else SMOKE_CLASSES
    samples = 2 if args.smoke and args.samples_per_class == 50 else args.samples_per_class
    settings = _settings(args)
    fractions = _kept_fractions(args, shifts)
    proc = current_process()
    device = proc.device(args.device, cpu=args.smoke)
    out = Path(args.out)
    plans = _plans(args, shifts, classes, samples)
    token_kind, token_path = _token_source(args)
    tokens = None
    if token_kind in ("released", "file"):  # validated before anything is written
        from genshift.builders.tokens import load_token_zip
        tokens = load_token_zip(token_path, classes=classes)
    fingerprint = {"shifts": shifts, "classes": classes, "samples": samples, "seed": args.seed,
                   "shards": {s: len(p) for s, p in plans.items()}, "generation": settings.to_dict(),
                   "tokens": token_kind, "tokens_sha256": _fingerprint_tokens(token_kind, token_path),
                   "ti": [args.ti_steps, args.ti_lr] if token_kind == "trained" else None, "smoke": args.smoke,
                   "clip": None if args.smoke else [args.clip_model, args.clip_pretrained],
                   "cpu_threads": args.cpu_threads, "keep_rule": args.keep_rule, "shift_gate_quantile": args.shift_gate_quantile
                   if args.keep_rule == "class+shift" else None, "kept_fractions": fractions}
    writer_kw = dict(suite_id=SUITE_ID, extra_features=_features(), fingerprint=fingerprint)
    if proc.is_main:
        final = SuiteWriter(out, overwrite=args.overwrite, **writer_kw)
    proc.wait()  # the main process may have replaced an old build; then everyone opens it
    if (out / MANIFEST).is_file():  # (same fingerprint, else the writer refused)
        if proc.is_main:
            print(f"{out} is already built (manifest present); nothing to do")
        return 0
    if not proc.is_main:
        final = SuiteWriter(out, clean_incomplete=False, **writer_kw)
    stage = SuiteWriter(out / STAGE, clean_incomplete=proc.is_main, **writer_kw)
    proc.wait()  # nobody writes before the main process has cleaned up stale temporary files

    work = [(shift, i, shard) for shift in shifts for i, shard in enumerate(plans[shift])]
    mine = [w for w in proc.my_shards(work) if not stage.shard_done(w[0], w[1], len(plans[w[0]]))]
    gen = clip = None
    token_info = {"tokens": None}
    if mine or proc.is_main or token_kind == "trained":  # every process trains its share of the tokens
        gen, clip, token_info = _load_models(args, settings, classes, device, out, token_kind, token_path, tokens)
    token_names = {c: (imagenet.get_class(c).name if token_kind == "none" else token_name(c)) for c in classes}
    total = sum(len(shard) * samples for _, _, shard in mine)
    bar = tqdm(total=total, desc=f"generate [{proc.index}/{proc.count}]", unit="img", disable=not args.progress,
               dynamic_ncols=True)
    try:
        for shift, i, shard in mine:
            items = [(c, k) for c in shard for k in range(samples)]
            rows = _shard_rows(items, shift, shifts[shift], gen, clip, args, token_names, bar,
                               lambda b: _record_batch_size(out, proc.index, b))
            stage.write_shard(shift, i, len(plans[shift]), rows)
    finally:
        bar.close()
    if not proc.is_main:
        return 0
    if proc.count > 1:
        _wait_for_stage(stage, work, plans, timeout=args.wait_timeout)
    provenance = {"builder": "genshift.builders.imagenet_star", "paper": "Vendrow et al., Dataset Interfaces (2023)",
                  "generation": {**gen.provenance(), "batch_size_effective": _effective_batch_sizes(out)},
                  "determinism": determinism.provenance(args.cpu_threads, device), "clip_filter": {"model": clip.model_id, "rule": args.keep_rule},
                  "seed": args.seed, "seed_rule": "derive_seed(seed, shift, class, sample) = sha256 -> 63 bits",
                  "samples_per_class": samples, "classes": len(classes), "shifts": shifts, **token_info,
                  "library_versions": _versions()}
    filt = _filter_phase(out, final, {s: len(p) for s, p in plans.items()}, fractions, args.keep_rule,
                         args.shift_gate_quantile)
    provenance["clip_filter"].update(filt)
    manifest = final.finalize(generator=provenance, card=lambda m: _card(m, provenance))
    shutil.rmtree(out / STAGE, ignore_errors=True)
    shutil.rmtree(out / TOKENS_WORK, ignore_errors=True)
    kept = {c: f"{v.kept}/{v.rows}" for c, v in manifest.configs.items()}
    print(f"built {out}: {sum(v.rows for v in manifest.configs.values())} images; kept {kept}; "
          f"manifest sha256 {manifest.sha256}")
    return 0


def _record_batch_size(out: Path, index: int, size: int) -> None:
    from genshift.fsutil import atomic_write_json

    atomic_write_json(out / STAGE / f"batch-size-{index}.json", {"process": index, "batch_size": size})


def _effective_batch_sizes(out: Path) -> dict[str, int]:
    """``{process index: generation batch size it ended with}`` (below ``batch_size`` after an
    out-of-memory back-off), for every process that generated a shard. Each process records its
    size before its shard file appears (``_shard_rows``), so once all shards exist so do the records."""
    found = {int(p.stem.rsplit("-", 1)[1]): p for p in (out / STAGE).glob("batch-size-*.json")}
    return {str(i): json.loads(found[i].read_text())["batch_size"] for i in sorted(found)}


def _fingerprint_tokens(kind: str, path: str | None) -> str | None:
    from genshift.builders.tokens import tokens_digest

    return tokens_digest(path) if kind in ("released", "file") else None


def _wait_for_stage(stage, work, plans, *, timeout: float) -> None:
    """Wait (main process) until every staged shard exists."""
    _wait_for(lambda: [f"{s} #{i}" for s, i, _ in work if not stage.shard_done(s, i, len(plans[s]))],
              "generated shard(s)", timeout)


def _wait_for(missing_fn, what: str, timeout: float, *, poll: float = 10.0) -> None:
    """Poll the file system until ``missing_fn()`` is empty; give up after ``timeout`` s without progress.

    (A file-system wait, not a collective barrier: processes may finish hours apart.)
    """
    from genshift.errors import BenchError

    last, t_last = -1, time.monotonic()
    while missing := missing_fn():
        if len(missing) != last:
            last, t_last = len(missing), time.monotonic()
            log.info("waiting for %d %s of the other processes", len(missing), what)
        elif time.monotonic() - t_last > timeout:
            raise BenchError(f"{len(missing)} {what} (e.g. {missing[0]}) did not appear within {timeout:.0f} s; a "
                             "process may have died: rerun the build to finish them")
        time.sleep(poll)


def _kept_fractions(args, shifts) -> dict[str, float]:
    from genshift.errors import BenchError
    from genshift.builders.clip_filter import RELEASED_KEPT_FRACTION

    table = dict(RELEASED_KEPT_FRACTION)
    if args.kept_fractions:
        try:
            table.update({k: float(v) for k, v in json.loads(Path(args.kept_fractions).read_text()).items()})
        except (OSError, ValueError, AttributeError) as e:
            raise BenchError(f"--kept-fractions {args.kept_fractions!r}: expected a JSON object shift -> fraction ({e})") from None
    missing = [s for s in shifts if s not in table]
    if missing:
        raise BenchError(f"no target kept fraction for shift(s) {', '.join(missing)}; give them with --kept-fractions")
    bad = {s: table[s] for s in shifts if not 0.0 <= table[s] <= 1.0}
    if bad:
        raise BenchError(f"--kept-fractions: fractions must be in [0, 1], got {bad}")
    return {s: table[s] for s in shifts}


def _filter_phase(out: Path, final, n_shards: dict[str, int], fractions, rule: str, gate_quantile: float) -> dict:
    """Calibrate per-shift thresholds on all staged scores, then write the final shards with keep."""
    import numpy as np
    import pyarrow.parquet as pq

    from genshift.errors import BenchError
    from genshift.suite_format import shard_name
    from genshift.builders.clip_filter import calibrate, kept_target

    missing = [shard_name(s, i, n) for s, n in n_shards.items() for i in range(n)
               if not (out / STAGE / shard_name(s, i, n)).is_file() and not final.shard_done(s, i, n)]
    if missing:
        raise BenchError(f"{len(missing)} generated shard(s) are missing (e.g. {missing[0]}); rerun the build")
    cls_scores, shift_scores = {}, {}
    for shift, n in n_shards.items():
        parts = [pq.read_table(_shard_source(out, final, shift, i, n), columns=["clip_class_score", "clip_shift_score"])
                 for i in range(n)]
        cls_scores[shift] = np.concatenate([p["clip_class_score"].to_numpy() for p in parts])
        shift_scores[shift] = np.concatenate([p["clip_shift_score"].to_numpy(zero_copy_only=False).astype(float)
                                              for p in parts])
    thresholds = calibrate(cls_scores, fractions, rule=rule, shift_scores=shift_scores, shift_quantile=gate_quantile)
    for shift, n in n_shards.items():
        for i in range(n):
            if not final.shard_done(shift, i, n):
                final.write_shard(shift, i, n, _with_keep(out / STAGE / shard_name(shift, i, n), thresholds[shift]))

    def finite(x):
        return None if x is None or not math.isfinite(x) else x

    return {"thresholds": {s: {"class": finite(t.class_threshold), "shift": finite(t.shift_threshold)}
                           for s, t in thresholds.items()},
            "shift_gate_quantile": gate_quantile if rule == "class+shift" else None,
            "target_kept_fractions": fractions,
            "target_kept": {s: kept_target(v.size, fractions[s]) for s, v in cls_scores.items()},
            "class_caption": "a photo of a <class name>",
            "shift_caption": "the shift prompt with <TOKEN> -> 'thing' (none for base)",
            "threshold_null_means": "class: keep none (target 0); shift: no gate"}


def _shard_source(out: Path, final, shift: str, i: int, n: int) -> Path:
    """The staged shard, or the final one when a previous filter phase already wrote it."""
    from genshift.suite_format import shard_name

    staged = out / STAGE / shard_name(shift, i, n)
    return staged if staged.is_file() else final.root / shard_name(shift, i, n)


def _with_keep(staged: Path, thresholds):
    """Stream a staged shard's rows with ``keep`` set (bounded memory: 100 rows at a time)."""
    import pyarrow.parquet as pq

    from genshift.builders.clip_filter import keep_flags

    for batch in pq.ParquetFile(staged).iter_batches(batch_size=100):
        keep = keep_flags(batch.column("clip_class_score").to_numpy(zero_copy_only=False),
                          batch.column("clip_shift_score").to_numpy(zero_copy_only=False).astype(float), thresholds)
        for row, k in zip(batch.to_pylist(), keep):
            row["keep"] = bool(k)
            yield row


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "diffusers", "transformers", "open_clip_torch", "datasets", "pillow", "genshift-bench"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _card(manifest, provenance: dict) -> str:
    from genshift.data_cards import render_card

    return render_card(manifest, template="imagenet_star", license="mit", pretty_name="ImageNet* (genshift-bench rebuild)",
                       tags=["imagenet-star", "dataset-interfaces", "synthetic"], context={"p": provenance})
