"""``bench build imagenet-star``: regenerate ImageNet* (Vendrow et al., Dataset Interfaces).

Pipeline (``specs/imagenet_star.md``): class tokens (the released ones, tokens trained here with
``--train-tokens``, or the class names) -> Stable Diffusion 2 with the shift prompts (Euler, 50
steps, guidance 7.5, 768 px, stored as 512 px JPEG) -> CLIP presence scores -> ``keep``.

Two phases, both resumable:

1. **generate** (every process of an ``accelerate launch``): work items (shift, class, sample) are
   grouped into shards by ``sha256(shift/class) mod shards``; each shard's images are generated
   with a seed derived from (suite seed, shift, class, sample), scored by CLIP, and written
   atomically to ``<out>/.stage/``. A rerun skips finished shards.
2. **filter** (main process, after all shards exist): per shift, the keep threshold is calibrated
   on all of the shift's class-presence scores (``builders.clip_filter``); the final shards are
   written to ``<out>/data/`` with ``keep`` set (JPEG bytes copied, never re-encoded), then the card
   and the manifest.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
from pathlib import Path

from benchmark.cli._common import csv_list, positive_int

log = logging.getLogger(__name__)
SUITE_ID = "imagenet-star"
STAGE = ".stage"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output suite folder (resumable; see --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace a different build in --out")
    p.add_argument("--smoke", action="store_true",
                   help="whole pipeline with tiny random models on CPU: 2 classes x 2 shifts x 2 samples")
    p.add_argument("--shifts", type=csv_list, help="shift keys (default: base + the 23 shifts)")
    p.add_argument("--shifts-file", help="YAML prompt table (list of {key, prompt, group, status}) to use instead")
    p.add_argument("--classes", type=csv_list, help="class indices or wnids, or a range like 0-99 (default: all 1000)")
    p.add_argument("--samples-per-class", type=positive_int, default=50)
    p.add_argument("--images-per-shard", type=positive_int, default=2500, help="sets the number of shards per shift")
    p.add_argument("--seed", type=int, default=0, help="suite seed; every image's seed derives from it and its ids")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--tokens", help="released tokens.zip (madrylab/imagenet-star-tokens)")
    tok.add_argument("--train-tokens", metavar="DIR", help="train tokens by textual inversion on DIR/<wnid>/ images")
    tok.add_argument("--no-tokens", action="store_true", help="prompt with class names instead of tokens")
    p.add_argument("--ti-steps", type=positive_int, default=3000)
    p.add_argument("--ti-lr", type=float, default=5e-4)
    p.add_argument("--model", default="stabilityai/stable-diffusion-2")
    p.add_argument("--model-revision")
    p.add_argument("--steps", type=positive_int, default=50)
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--height", type=positive_int, default=768)
    p.add_argument("--width", type=positive_int, default=768)
    p.add_argument("--output-size", type=positive_int, default=512)
    p.add_argument("--jpeg-quality", type=int, default=95)
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    p.add_argument("--batch-size", type=positive_int, default=8)
    p.add_argument("--device", help="default: cuda when available (each accelerate process gets its own GPU)")
    p.add_argument("--clip-model", default="ViT-H-14")
    p.add_argument("--clip-pretrained", default="laion2b_s32b_b79k")
    p.add_argument("--keep-rule", choices=("class", "class+shift"), default="class")
    p.add_argument("--kept-fractions", help="JSON {shift: fraction} targets (default: the released masks' fractions)")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def _parse_classes(items: list[str] | None) -> list[int]:
    from benchmark import imagenet
    from benchmark.errors import BenchError

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

    from benchmark.errors import BenchError, unknown
    from benchmark.suites import imagenet_star_shifts

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
    from builders.sd_generate import GenerationSettings

    if args.smoke:
        return GenerationSettings(model_id="tiny-random-sd2(seed=0)", scheduler="euler", steps=2, guidance=args.guidance,
                                  height=64, width=64, output_size=32, jpeg_quality=args.jpeg_quality,
                                  dtype="float32", batch_size=min(args.batch_size, 4))
    return GenerationSettings(model_id=args.model, revision=args.model_revision, scheduler="euler", steps=args.steps,
                              guidance=args.guidance, height=args.height, width=args.width,
                              output_size=args.output_size, jpeg_quality=args.jpeg_quality, dtype=args.dtype,
                              batch_size=args.batch_size)


def _load_models(args, settings, classes: list[int], device: str, out: Path):
    """(generator, CLIP scorer, token provenance)."""
    import torch

    from benchmark.fsutil import sha256_file
    from builders.clip_scoring import ClipScorer
    from builders.sd_generate import SDGenerator
    from builders.tokens import load_token_zip, save_token_zip

    if args.smoke:
        from builders.textual_inversion import initializer
        from builders.tiny import tiny_sd_components
        from benchmark import imagenet

        comp = tiny_sd_components(prediction_type="v_prediction")
        tokens = {c: initializer(comp["tokenizer"], comp["text_encoder"], imagenet.get_class(c).name) for c in classes}
        gen = SDGenerator.tiny(settings, tokens=tokens)
        return gen, ClipScorer.tiny(), {"tokens": "class-name initializers of the tiny text encoder"}
    tokens, token_info = None, {"tokens": None}
    if args.tokens:
        tokens = load_token_zip(args.tokens, classes=classes)
        token_info = {"tokens": Path(args.tokens).name, "tokens_sha256": sha256_file(args.tokens)}
    elif args.train_tokens:
        from builders.textual_inversion import TIConfig, TIRun, train_tokens

        base = SDGenerator.from_pretrained(settings, device=device)
        p = base.pipe
        run = TIRun(p.unet, p.vae, p.text_encoder, p.tokenizer, p.scheduler, torch.device(device))
        tokens = train_tokens(args.train_tokens, out / ".tokens", run, TIConfig(steps=args.ti_steps, lr=args.ti_lr),
                              classes=classes, progress=args.progress)
        save_token_zip(tokens, out / "tokens.zip")
        token_info = {"tokens": "trained here (tokens.zip)", "tokens_sha256": sha256_file(out / "tokens.zip"),
                      "textual_inversion": {"steps": args.ti_steps, "lr": args.ti_lr, "data": str(args.train_tokens)}}
    gen = SDGenerator.from_pretrained(settings, device=device, tokens=tokens)
    clip = ClipScorer.from_pretrained(args.clip_model, args.clip_pretrained, device=device)
    return gen, clip, token_info


def _features():
    from datasets import Sequence, Value

    return {"shift": Value("string"), "prompt": Value("string"), "class_token": Value("string"),
            "seed": Value("int64"), "sample": Value("int32"), "generator": Value("string"),
            "clip_class_score": Value("float32"), "clip_shift_score": Value("float32"),
            "clip_image_embedding": Sequence(Value("float32"))}


def _shard_rows(items, shift, prompt, gen, clip, args, token_names, progress_bar):
    """Generate, score and yield the rows of one shard, in batches."""
    import io

    from PIL import Image

    from benchmark import imagenet
    from builders.clip_filter import clip_scores
    from builders.seeding import derive_seed

    bs = gen.settings.batch_size
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
                   "seed": seeds[j], "sample": k, "generator": gen.settings.model_id,
                   "clip_class_score": float(sc["class_score"][j]),
                   "clip_shift_score": None if sc["shift_score"][j] != sc["shift_score"][j] else float(sc["shift_score"][j]),
                   "clip_image_embedding": sc["embedding"][j].tolist()}
        if progress_bar is not None:
            progress_bar.update(len(chunk))


def run(args) -> int:
    import torch
    from tqdm.auto import tqdm

    from benchmark import imagenet
    from benchmark.errors import BenchError
    from benchmark.writer import SuiteWriter
    from builders.sharding import current_process, plan_nonempty_shards
    from builders.tokens import token_name

    shifts = _shift_table(args)
    classes = _parse_classes(args.classes) if not (args.smoke and not args.classes) else [0, 1]
    samples = 2 if args.smoke and args.samples_per_class == 50 else args.samples_per_class
    settings = _settings(args)
    fractions = _kept_fractions(args, shifts)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        device = "cpu"
    proc = current_process()
    if device == "cuda" and proc.count > 1:
        device = f"cuda:{proc.index % max(1, torch.cuda.device_count())}"
    out = Path(args.out)
    target = max(1, math.ceil(len(classes) * samples / args.images_per_shard))
    plans = {s: plan_nonempty_shards(classes, target, key=lambda c, s=s: f"{s}/{c}") for s in shifts}
    fingerprint = {"shifts": shifts, "classes": classes, "samples": samples, "seed": args.seed,
                   "shards": {s: len(p) for s, p in plans.items()},
                   "generation": settings.to_dict(), "tokens": args.tokens and Path(args.tokens).name,
                   "train_tokens": args.train_tokens, "no_tokens": args.no_tokens, "smoke": args.smoke,
                   "clip": None if args.smoke else [args.clip_model, args.clip_pretrained],
                   "keep_rule": args.keep_rule, "kept_fractions": fractions}
    writer_kw = dict(suite_id=SUITE_ID, extra_features=_features(), fingerprint=fingerprint)
    if proc.is_main:
        final = SuiteWriter(out, overwrite=args.overwrite, **writer_kw)
        if final.finished:
            print(f"{out} is already built (manifest present); nothing to do")
            return 0
    proc.wait()
    if not proc.is_main:
        final = SuiteWriter(out, clean_incomplete=False, **writer_kw)
    stage = SuiteWriter(out / STAGE, clean_incomplete=proc.is_main, **writer_kw)

    gen, clip, token_info = _load_models(args, settings, classes, device, out)
    token_names = {c: (imagenet.get_class(c).name if args.no_tokens else token_name(c)) for c in classes}
    work = [(shift, i, shard) for shift in shifts for i, shard in enumerate(plans[shift])]
    mine = [w for w in proc.my_shards(work) if not stage.shard_done(w[0], w[1], len(plans[w[0]]))]
    total = sum(len(shard) * samples for _, _, shard in mine)
    bar = tqdm(total=total, desc="generate", unit="img", disable=not args.progress, dynamic_ncols=True)
    try:
        for shift, i, shard in mine:
            items = [(c, k) for c in shard for k in range(samples)]
            stage.write_shard(shift, i, len(plans[shift]), _shard_rows(items, shift, shifts[shift], gen, clip, args,
                                                                        token_names, bar))
    finally:
        bar.close()
    proc.wait()
    if not proc.is_main:
        return 0
    provenance = {"builder": "builders.imagenet_star", "paper": "Vendrow et al., Dataset Interfaces (2023)",
                  "generation": gen.provenance(), "clip_filter": {"model": clip.model_id, "rule": args.keep_rule},
                  "seed": args.seed, "seed_rule": "derive_seed(seed, shift, class, sample) = sha256 -> 63 bits",
                  "samples_per_class": samples, "classes": len(classes), "shifts": shifts, **token_info,
                  "library_versions": _versions()}
    thresholds = _filter_phase(out, final, {s: len(p) for s, p in plans.items()}, fractions, args.keep_rule)
    provenance["clip_filter"]["thresholds"] = thresholds
    provenance["clip_filter"]["target_kept_fractions"] = fractions
    manifest = final.finalize(generator=provenance, card=lambda m: _card(m, provenance))
    shutil.rmtree(out / STAGE, ignore_errors=True)
    shutil.rmtree(out / ".tokens", ignore_errors=True)
    kept = {c: f"{v.kept}/{v.rows}" for c, v in manifest.configs.items()}
    print(f"built {out}: {sum(v.rows for v in manifest.configs.values())} images; kept {kept}; "
          f"manifest sha256 {manifest.sha256}")
    return 0


def _kept_fractions(args, shifts) -> dict[str, float]:
    from benchmark.errors import BenchError
    from builders.clip_filter import RELEASED_KEPT_FRACTION

    table = dict(RELEASED_KEPT_FRACTION)
    if args.kept_fractions:
        try:
            table.update({k: float(v) for k, v in json.loads(Path(args.kept_fractions).read_text()).items()})
        except (OSError, ValueError, AttributeError) as e:
            raise BenchError(f"--kept-fractions {args.kept_fractions!r}: expected a JSON object shift -> fraction ({e})") from None
    missing = [s for s in shifts if s not in table]
    if missing:
        raise BenchError(f"no target kept fraction for shift(s) {', '.join(missing)}; give them with --kept-fractions")
    return {s: table[s] for s in shifts}


def _filter_phase(out: Path, final, n_shards: dict[str, int], fractions, rule: str) -> dict:
    """Calibrate per-shift thresholds on all staged scores, then write the final shards with keep."""
    import numpy as np
    import pyarrow.parquet as pq

    from benchmark.suite_format import shard_name
    from builders.clip_filter import calibrate_thresholds

    scores = {}
    for shift, n in n_shards.items():
        parts = [pq.read_table(out / STAGE / shard_name(shift, i, n), columns=["clip_class_score"])
                 for i in range(n) if (out / STAGE / shard_name(shift, i, n)).is_file()]
        scores[shift] = np.concatenate([p["clip_class_score"].to_numpy() for p in parts])
    thresholds = calibrate_thresholds(scores, fractions)
    for shift, n in n_shards.items():
        for i in range(n):
            staged = out / STAGE / shard_name(shift, i, n)
            if final.shard_done(shift, i, n) or not staged.is_file():
                continue
            final.write_shard(shift, i, n, _with_keep(staged, thresholds[shift], rule))
    return {s: (None if not np.isfinite(t) else round(t, 6)) for s, t in thresholds.items()}


def _with_keep(staged: Path, threshold: float, rule: str):
    """Stream a staged shard's rows with ``keep`` set (bounded memory: 100 rows at a time)."""
    import pyarrow.parquet as pq

    from builders.clip_filter import keep_flags

    for batch in pq.ParquetFile(staged).iter_batches(batch_size=100):
        keep = keep_flags(batch.column("clip_class_score").to_numpy(zero_copy_only=False),
                          batch.column("clip_shift_score").to_numpy(zero_copy_only=False).astype(float),
                          threshold, rule=rule)
        for row, k in zip(batch.to_pylist(), keep):
            row["keep"] = bool(k)
            yield row


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "diffusers", "transformers", "open_clip_torch", "datasets", "genshift-bench"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _card(manifest, provenance: dict) -> str:
    from data_cards import render_card

    return render_card(manifest, template="imagenet_star", license="mit", pretty_name="ImageNet* (genshift-bench rebuild)",
                       tags=["imagenet-star", "dataset-interfaces", "synthetic"], context={"p": provenance})
