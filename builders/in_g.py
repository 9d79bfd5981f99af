"""``bench build in-g-rn | in-g-vit``: generated images that fool a ResNet-50 / ViT-B/16 (Wiles et al.).

No code or data was released for these sets; this is an open re-creation with substitutes
(``docs/builders.md``): seed captions from ImageNet-A images (a BLIP-2 captioner forced to
continue the class prompt, at most two sentences) or from a caption file; Stable Diffusion 2.1-base
as the generator; the timm target (``resnet50.tv_in1k`` / ``vit_base_patch16_224.augreg_in1k``);
failures kept by the WordNet-parent rule up to a cap per caption. Mining is resumable per caption
and spread over ``accelerate`` processes by caption id; the main process writes the suite.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path

from genshift.cli._common import positive_int
from genshift.builders import determinism

log = logging.getLogger(__name__)
TARGETS = {"in-g-rn": "resnet50.tv_in1k", "in-g-vit": "vit_base_patch16_224.augreg_in1k"}
WORK = ".work"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="output suite folder (resumable; see --overwrite); required unless --preflight")
    p.add_argument("--overwrite", action="store_true", help="replace a different build in --out")
    p.add_argument("--smoke", action="store_true", help="whole pipeline with tiny random models on CPU")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--captions", help="seed captions: CSV class,caption or JSONL {class, caption}")
    src.add_argument("--imagenet-a", help="ImageNet-A folder (<wnid>/*.jpg) to caption with --captioner")
    p.add_argument("--captioner", default="Salesforce/blip2-opt-2.7b", help="BLIP-2 checkpoint for --imagenet-a")
    p.add_argument("--images-per-class", type=positive_int, help="caption at most N ImageNet-A images per class")
    p.add_argument("--an", action="store_true", help="a/an in class prompts (the paper always writes 'a')")
    p.add_argument("--target", help="timm target model (default: resnet50.tv_in1k for in-g-rn, "
                                    "vit_base_patch16_224.augreg_in1k for in-g-vit)")
    p.add_argument("--target-checkpoint", help="local weights for the target")
    p.add_argument("--n-max", type=positive_int, default=1000, help="images sampled per caption at most")
    p.add_argument("--cap", type=int, default=2, help="failures kept per caption")
    p.add_argument("--seed", type=int, default=0, help="suite seed; every image's seed derives from it and its ids")
    p.add_argument("--generator", default="stabilityai/stable-diffusion-2-1-base",
                   help="Stable Diffusion checkpoint (Hub repo) of the generator")
    p.add_argument("--generator-revision",
                   help="commit sha of --generator to pin (default: main, resolved sha recorded)")
    p.add_argument("--steps", type=positive_int, default=50, help="diffusion steps per image")
    p.add_argument("--guidance", type=float, default=7.5, help="classifier-free guidance scale")
    p.add_argument("--size", type=positive_int, default=512, help="generated image size in pixels")
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="generator weights dtype")
    p.add_argument("--batch-size", type=positive_int, default=8, help="images per generation batch")
    p.add_argument("--captions-per-shard", type=positive_int, default=500, help="failing captions per output parquet shard")
    p.add_argument("--device", help="default: cuda when available")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    determinism.add_arguments(p)


def _features():
    from datasets import Sequence, Value

    return {"caption": Value("string"), "caption_id": Value("string"), "class_prompt": Value("string"),
            "parent_wnid": Value("string"), "seed": Value("int64"), "attempt": Value("int32"),
            "generator": Value("string"), "target_model": Value("string"), "target_weights_sha256": Value("string"),
            "target_top5_idx": Sequence(Value("int16")), "target_top5_prob": Sequence(Value("float32")),
            "top1_miss": Value("bool"), "top3_miss": Value("bool"), "parent_failure": Value("bool")}


SMOKE_SENTENCES = ("it is on a table. the background is green.", "it is in the snow. the background is white.")


def _captions(args, out: Path, device: str) -> tuple[list[tuple[int, str]], dict]:
    from genshift import imagenet
    from genshift.errors import BenchError
    from genshift.fsutil import atomic_write_bytes, sha256_file
    from genshift.builders.in_g_prompts import class_prompt, read_captions, seed_caption

    if args.captions:
        caps = read_captions(args.captions, an=args.an)
        return caps, {"source": "file", "file": Path(args.captions).name, "sha256": sha256_file(args.captions)}
    if args.smoke:
        labels = list(imagenet.imagenet_a_indices()[:2])
        caps = [(y, seed_caption(class_prompt(y, an=args.an).text, s)) for y in labels for s in SMOKE_SENTENCES]
        return caps, {"source": "smoke: class prompts + fixed sentences"}
    if not args.imagenet_a:
        raise BenchError("give seed captions: --captions FILE or --imagenet-a DIR (images to caption)")
    cache = out / WORK / "captions.jsonl"
    if cache.is_file():
        caps = read_captions(cache, an=args.an)
    else:
        from PIL import Image

        from genshift.builders.captioner import Captioner

        root = Path(args.imagenet_a)
        if not root.is_dir():
            raise BenchError(f"--imagenet-a {str(root)!r} is not a folder of <wnid>/ image folders")
        cap = Captioner.from_pretrained(args.captioner, device=device)
        caps = []
        for d in sorted(p for p in root.iterdir() if p.is_dir()):
            y = imagenet.index_of(d.name)
            prompt = class_prompt(y, an=args.an).text
            files = sorted(f for f in d.iterdir() if f.suffix.lower() in (".jpg", ".jpeg", ".png"))
            files = files[: args.images_per_class] if args.images_per_class else files
            for a in range(0, len(files), 16):
                imgs = [Image.open(f) for f in files[a:a + 16]]
                for text in cap.caption(imgs, prefix=prompt, num_beams=5, min_new_tokens=8, max_new_tokens=40):
                    caps.append((y, seed_caption(prompt, text)))
        if not caps:
            raise BenchError(f"no images found under {root}")
        lines = "".join(json.dumps({"class": y, "caption": c}) + "\n" for y, c in dict.fromkeys(caps))
        atomic_write_bytes(cache, lines.encode())
    return list(dict.fromkeys(caps)), {"source": "imagenet-a", "captioner": args.captioner,
                                        "decoding": "beam 5, 8-40 new tokens, forced class prompt, <= 2 sentences"}


def run(args) -> int:
    with determinism.fixed_threads(args.cpu_threads):
        return _run(args)


def _run(args) -> int:
    from genshift.errors import BenchError
    from genshift.fsutil import atomic_write_json, canonical_json, sha256_bytes
    from genshift.writer import SuiteWriter
    from genshift.builders.in_g_mining import MiningConfig, classifier_from_timm, mine_all
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator
    from genshift.distributed import current_process, plan_nonempty_shards, shard_of

    suite_id = args.suite
    cfg = MiningConfig(n_max=args.n_max if not args.smoke or args.n_max != 1000 else 8, cap=args.cap,
                       batch_size=args.batch_size if not args.smoke else 4, seed=args.seed)
    proc = current_process()
    device = proc.device(args.device, cpu=args.smoke)  # each accelerate process on its node-local GPU
    out = Path(args.out)
    target = args.target or TARGETS[suite_id]
    if args.smoke:
        settings = GenerationSettings(model_id="tiny-random-sd(seed=0)", scheduler="default", steps=2, height=64,
                                      width=64, output_size=64, dtype="float32", batch_size=4)
    else:
        settings = GenerationSettings(model_id=args.generator, revision=args.generator_revision, scheduler="default",
                                      steps=args.steps, guidance=args.guidance, height=args.size, width=args.size,
                                      output_size=args.size, dtype=args.dtype, batch_size=args.batch_size)
    captions, caption_info = _captions(args, out, device)
    fingerprint = {"suite": suite_id, "target": target, "captions": sha256_bytes(canonical_json(captions)),
                   "mining": cfg.__dict__, "generation": settings.to_dict(), "an": args.an, "smoke": args.smoke,
                   "cpu_threads": args.cpu_threads}
    kw = dict(suite_id=suite_id, extra_features=_features(), fingerprint=fingerprint)
    if proc.is_main:
        writer = SuiteWriter(out, overwrite=args.overwrite, **kw)
        if writer.finished:
            print(f"{out} is already built (manifest present); nothing to do")
            return 0
    proc.wait()
    if not proc.is_main:
        writer = SuiteWriter(out, clean_incomplete=False, **kw)

    if args.smoke:
        import torch

        with torch.random.fork_rng(devices=[]):  # seeded random weights: the smoke suite is reproducible
            torch.manual_seed(0)
            classify, target_desc = classifier_from_timm("test_resnet.r160_in1k", pretrained=False)
        target = "test_resnet.r160_in1k (random weights, smoke)"
        gen = SDGenerator.tiny(settings, prediction_type="epsilon")
    else:
        classify, target_desc = classifier_from_timm(target, device=device, checkpoint=args.target_checkpoint)
        gen = SDGenerator.from_pretrained(settings, device=device)
    results = mine_all(captions, out / WORK / "captions", generate=gen.generate, classify=classify, cfg=cfg,
                       owns=lambda cid: shard_of(cid, proc.count) == proc.index, progress=args.progress)
    # the generation batch size this process ended with (after any out-of-memory back-off)
    atomic_write_json(out / WORK / f"batch-size-{proc.index}.json", {"batch_size": gen.backoff.batch_size})
    proc.wait()
    if not proc.is_main:
        return 0
    results = mine_all(captions, out / WORK / "captions", generate=gen.generate, classify=classify, cfg=cfg,
                       progress=False)  # every checkpoint now exists: loads them all
    with_failures = [r for r in results.values() if r.kept]
    if not with_failures:
        raise BenchError(f"no failures were found for any of {len(results)} captions; raise --n-max or check the target")
    n_shards = max(1, len(with_failures) // args.captions_per_shard)
    shards = plan_nonempty_shards(with_failures, n_shards, key=lambda r: r.caption_id)
    for i, shard in enumerate(shards):
        if not writer.shard_done("generated", i, len(shards)):
            writer.write_shard("generated", i, len(shards), _rows(shard, settings, target, target_desc, args.an))
    stats = {r.caption_id: {"label": r.label, "sampled": r.sampled, "kept": len(r.kept)} for r in results.values()}
    sampled = sum(s["sampled"] for s in stats.values())
    kept = sum(s["kept"] for s in stats.values())
    provenance = {"builder": "genshift.builders.in_g", "paper": "Wiles, Albuquerque, Gowal (2022)", "suite": suite_id,
                  "target": {"model": target, **target_desc},
                  "generation": {**gen.provenance(), "batch_size_effective": {
                      str(i): json.loads((out / WORK / f"batch-size-{i}.json").read_text())["batch_size"]
                      for i in range(proc.count)}},
                  "determinism": determinism.provenance(args.cpu_threads, device),
                  "mining": {**cfg.__dict__, "failure": "none of the target's top-3 predictions is under the WordNet parent of the label",
                             "seed_rule": "derive_seed(seed, caption_id, attempt)"},
                  "captions": {**caption_info, "count": len(results), "with_failures": len(with_failures)},
                  "yield": {"sampled": sampled, "kept": kept, "kept_per_sampled": kept / sampled if sampled else None},
                  "per_caption": stats}
    manifest = writer.finalize(generator=provenance, card=lambda m: _card(m, provenance))
    shutil.rmtree(out / WORK, ignore_errors=True)
    print(f"built {out}: {kept} failures kept from {sampled} images over {len(results)} captions "
          f"({len(with_failures)} with failures); manifest sha256 {manifest.sha256}")
    return 0


def _rows(results, settings, target: str, target_desc: dict, an: bool):
    from genshift.builders.in_g_prompts import class_prompt

    for r in results:
        cp = class_prompt(r.label, an=an)
        for a in r.kept:
            yield {"image": {"bytes": a.image, "path": None}, "label": r.label,
                   "image_id": f"{r.caption_id}/{a.index:04d}", "config": "generated", "keep": True, "pair_id": None,
                   "caption": r.caption, "caption_id": r.caption_id, "class_prompt": cp.text,
                   "parent_wnid": cp.parent_wnid, "seed": a.seed, "attempt": a.index, "generator": settings.model_id,
                   "target_model": target, "target_weights_sha256": target_desc.get("weights_sha256") or "",
                   "target_top5_idx": a.top5_idx, "target_top5_prob": a.top5_prob, "top1_miss": a.top1_miss,
                   "top3_miss": a.top3_miss, "parent_failure": a.parent_failure}


def _card(manifest, provenance: dict) -> str:
    from genshift.data_cards import render_card

    name = "IN-G-RN" if provenance["suite"] == "in-g-rn" else "IN-G-ViT"
    return render_card(manifest, template="in_g", license="other", pretty_name=f"{name} (genshift-bench re-creation)",
                       tags=["in-g", "failure-mining", "synthetic"], context={"p": provenance, "name": name})
