"""``bench build in-g-rn | in-g-vit``: generated images that fool a ResNet-50 / ViT-B/16 (Wiles et al.), an
open re-creation with substitutes (``docs/builders.md``, IN-G). Mining is resumable per caption and spread over
``accelerate`` processes by caption id; the main process writes the suite.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from genshift import imagenet
from genshift.builders import common
from genshift.builders.common import BuildConfig, ConfigError, option, threaded
from genshift.builders.in_g_prompts import CAPTIONING, captioner_fn, class_prompt, read_captions, seed_caption, shots
from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes, sha256_file

TARGETS = {"in-g-rn": "resnet50.tv_in1k", "in-g-vit": "vit_base_patch16_224.augreg_in1k"}
WORK = ".work"
FEW_SHOT_PROMPT = ("per shot: the shot image (its BLIP-2 query tokens), then its caption; then the image to caption "
                   "and its class prompt, which the captioner continues")


@dataclass(frozen=True)
class Config(BuildConfig):
    """The options of ``bench build in-g-rn | in-g-vit``."""

    suite: str = "in-g-rn"  # which set: the target it mines against (no flag: the CLI's <suite>)
    captions: str | None = option(None, "seed captions: CSV class,caption or JSONL {class, caption}")
    imagenet_a: str | None = option(None, "ImageNet-A folder (<wnid>/*.jpg) to caption with --captioner")
    captioning: str = option("three-shot", "three-shot: the paper's few-shot prompt (three image and caption pairs "
                                           "before each image, recorded in the manifest); single-image: the image "
                                           "and its class prompt only", choices=CAPTIONING)
    captioner: str = option("Salesforce/blip2-opt-2.7b", "BLIP-2 checkpoint for --imagenet-a")
    images_per_class: int | None = option(None, "caption at most N ImageNet-A images per class", min=1)
    dedup_captions: bool = option(False, "mine each distinct caption once (default: every image's caption, as the "
                                         "paper extracts captions from all 7,500 ImageNet-A images)")
    an: bool = option(False, "a/an in class prompts (the paper always writes 'a')")
    target: str | None = option(None, "timm target model (default: resnet50.tv_in1k for in-g-rn, "
                                      "vit_base_patch16_224.augreg_in1k for in-g-vit)")
    target_checkpoint: str | None = option(None, "local weights for the target")
    n_max: int = option(1000, "images sampled per caption at most (--smoke: 8)", min=1)
    cap: int = option(2, "failures kept per caption", min=1)
    generator: str = option("stabilityai/stable-diffusion-2-1-base", "Stable Diffusion checkpoint (Hub repo)")
    generator_revision: str | None = option(None, "commit sha of --generator to pin (default: main, resolved sha "
                                                  "recorded)")
    steps: int = option(50, "diffusion steps per image", min=1)
    guidance: float = option(7.5, "classifier-free guidance scale")
    size: int = option(512, "generated image size in pixels", min=8)
    dtype: str = option("float16", "generator weights dtype", choices=("float16", "bfloat16", "float32"))
    batch_size: int = option(8, "images per generation batch", min=1)
    captions_per_shard: int = option(500, "failing captions per output parquet shard", min=1)

    def check(self) -> None:
        if self.suite not in TARGETS:
            raise ConfigError("suite", f"{self.suite!r} is not an IN-G suite ({', '.join(TARGETS)})")
        if self.captions and self.imagenet_a:
            raise ConfigError("captions", "give seed captions one way: --captions FILE or --imagenet-a DIR")
        if self.n_max < self.cap:
            raise ConfigError("n_max", f"{self.n_max} is smaller than --cap {self.cap}: a caption could never fill "
                                       "its cap")


def _seed_images(cfg: Config):
    """(label, image file or bytes) of the images to caption: ImageNet-A's, or two synthetic ones per class (smoke)."""
    if cfg.smoke:
        from PIL import Image

        out = []
        for k, y in enumerate(imagenet.imagenet_a_indices()[:2]):
            for i in range(2):
                buf = io.BytesIO()
                Image.new("RGB", (48, 48), ((60 * k + 90 * i) % 256,) * 3).save(buf, format="PNG")
                out.append((y, buf.getvalue()))
        return out
    root = Path(cfg.imagenet_a)
    if not root.is_dir():
        raise ConfigError("imagenet_a", f"{str(root)!r} is not a folder of <wnid>/ image folders")
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(f for f in d.iterdir() if f.suffix.lower() in (".jpg", ".jpeg", ".png"))
        out += [(imagenet.index_of(d.name), f) for f in files[: cfg.images_per_class]]
    if not out:
        raise BenchError(f"no images found under {root}")
    return out


def _captions(cfg: Config, out: Path, device: str) -> tuple[list[tuple[int, str]], dict]:
    """The seed captions and how they were made: read from ``--captions``, or one per image of
    :func:`_seed_images` by the configured captioning (cached in the work folder for a resumed build)."""
    from genshift.builders.captioner import Captioner

    cache = out / WORK / "captions.jsonl"
    if cfg.captions:
        caps = read_captions(cfg.captions, an=cfg.an)
        info = {"source": "file", "file": Path(cfg.captions).name, "sha256": sha256_file(cfg.captions)}
    elif cache.is_file():
        lines = cache.read_text().splitlines()
        info = json.loads(lines[0])
        caps = [(r["class"], r["caption"]) for r in map(json.loads, lines[1:])]
    else:  # caption ImageNet-A (or, --smoke, synthetic images)
        cap = Captioner.tiny() if cfg.smoke else Captioner.from_pretrained(cfg.captioner, device=device)
        few, record = shots() if cfg.captioning == "three-shot" else ([], [])
        caption, images, caps = captioner_fn(cap, few), _seed_images(cfg), []
        for y in dict.fromkeys(y for y, _ in images):
            prompt = class_prompt(y, an=cfg.an).text
            texts = caption([src for label, src in images if label == y], prompt)
            caps += [(y, seed_caption(prompt, t)) for t in texts]
        info = {"source": "smoke: synthetic images" if cfg.smoke else "imagenet-a", "captioner": cap.model_id,
                "captioning": cfg.captioning,
                "decoding": "beam 5, 8-40 new tokens, forced class prompt, <= 2 sentences"}
        if few:
            info.update(shots=record, prompt=FEW_SHOT_PROMPT)
        text = [json.dumps(info)] + [json.dumps({"class": y, "caption": c}) for y, c in caps]
        atomic_write_bytes(cache, ("\n".join(text) + "\n").encode())
    if cfg.dedup_captions:
        caps = list(dict.fromkeys(caps))
    return caps, {**info, "deduplicated": cfg.dedup_captions}


@threaded
def run(cfg: Config) -> int:
    from genshift.builders.in_g_mining import MiningConfig, classifier_from_timm, mine_all
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator
    from genshift.data_cards import render_card
    from genshift.distributed import current_process, plan_nonempty_shards, shard_of

    if not (cfg.captions or cfg.imagenet_a or cfg.smoke):  # before anything is written
        raise BenchError("give seed captions: --captions FILE or --imagenet-a DIR (images to caption)")
    mining = MiningConfig(n_max=8 if cfg.smoke and cfg.n_max == 1000 else cfg.n_max, cap=cfg.cap,
                          batch_size=4 if cfg.smoke else cfg.batch_size, seed=cfg.seed)
    proc = current_process()
    device = proc.device(cfg.device, cpu=cfg.smoke)  # each accelerate process on its node-local GPU
    out = Path(cfg.out)
    target = cfg.target or TARGETS[cfg.suite]
    if cfg.smoke:
        settings = GenerationSettings(model_id="tiny-random-sd(seed=0)", scheduler="default", steps=2, height=64,
                                      width=64, output_size=64, dtype="float32", batch_size=4)
    else:
        settings = GenerationSettings(model_id=cfg.generator, revision=cfg.generator_revision, scheduler="default",
                                      steps=cfg.steps, guidance=cfg.guidance, height=cfg.size, width=cfg.size,
                                      output_size=cfg.size, dtype=cfg.dtype, batch_size=cfg.batch_size)
    seeds = ({"file": sha256_file(cfg.captions)} if cfg.captions else  # what the seed captions come from
             {"captioner": cfg.captioner, "captioning": cfg.captioning, "images_per_class": cfg.images_per_class})
    fingerprint = {"suite": cfg.suite, "target": target, "captions": seeds, "dedup": cfg.dedup_captions,
                   "mining": asdict(mining), "generation": asdict(settings), "an": cfg.an, "smoke": cfg.smoke,
                   "cpu_threads": cfg.cpu_threads}
    features = common.features(caption="string", caption_id="string", class_prompt="string", parent_wnid="string",
                               seed="int64", attempt="int32", generator="string", target_model="string",
                               target_weights_sha256="string", target_top5_idx="int16[]", target_top5_prob="float32[]",
                               top1_miss="bool", top3_miss="bool", parent_failure="bool")
    writer = common.open_writer(cfg, proc, suite_id=cfg.suite, extra_features=features, fingerprint=fingerprint)
    if writer is None:
        return 0
    if proc.is_main:  # the main process captions; the others read its captions
        captions, caption_info = _captions(cfg, out, device)
    proc.wait()
    if not proc.is_main:
        captions, caption_info = _captions(cfg, out, device)
    if cfg.smoke:
        import torch

        with torch.random.fork_rng(devices=[]):  # seeded random weights: the smoke suite is reproducible
            torch.manual_seed(0)
            classify, target_desc = classifier_from_timm("test_resnet.r160_in1k", pretrained=False)
        target = "test_resnet.r160_in1k (random weights, smoke)"
        gen = SDGenerator.tiny(settings, prediction_type="epsilon")
    else:
        classify, target_desc = classifier_from_timm(target, device=device, checkpoint=cfg.target_checkpoint)
        gen = SDGenerator.from_pretrained(settings, device=device)
    kw = dict(generate=gen.generate, classify=classify, cfg=mining)
    mine_all(captions, out / WORK / "captions", owns=lambda cid: shard_of(cid, proc.count) == proc.index,
             progress=cfg.progress, **kw)
    common.record_batch_size(out / WORK, proc.index, gen.backoff.batch_size)
    proc.wait()
    if not proc.is_main:
        return 0
    results = mine_all(captions, out / WORK / "captions", progress=False, **kw)  # every checkpoint exists: loads all
    with_failures = [r for r in results.values() if r.kept]
    if not with_failures:
        raise BenchError(f"no failures were found for any of {len(results)} captions; raise --n-max or check the "
                         "target")
    shards = plan_nonempty_shards(with_failures, max(1, len(with_failures) // cfg.captions_per_shard),
                                  key=lambda r: r.caption_id)
    for i, shard in enumerate(shards):
        if not writer.shard_done("generated", i, len(shards)):
            writer.write_shard("generated", i, len(shards), _rows(shard, settings, target, target_desc, cfg.an))
    stats = {r.caption_id: {"label": r.label, "sampled": r.sampled, "kept": len(r.kept)} for r in results.values()}
    sampled = sum(s["sampled"] for s in stats.values())
    kept = sum(s["kept"] for s in stats.values())
    p = {"builder": "genshift.builders.in_g", "paper": "Wiles, Albuquerque, Gowal (2022)", "suite": cfg.suite,
         "target": {"model": target, **target_desc},
         "generation": {**gen.provenance(), "batch_size_effective": common.effective_batch_sizes(out / WORK)},
         "determinism": common.provenance(cfg.cpu_threads, device),
         "mining": {**asdict(mining), "failure": "none of the target's top-3 predictions is under the WordNet parent "
                                                 "of the label", "seed_rule": "derive_seed(seed, caption_id, attempt)"},
         "captions": {**caption_info, "count": len(results), "with_failures": len(with_failures)},
         "yield": {"sampled": sampled, "kept": kept, "kept_per_sampled": kept / sampled if sampled else None},
         "per_caption": stats}
    name = "IN-G-RN" if cfg.suite == "in-g-rn" else "IN-G-ViT"
    manifest = writer.finalize(generator=p, card=lambda m: render_card(
        m, template="in_g", license="other", pretty_name=f"{name} (genshift-bench re-creation)",
        tags=["in-g", "failure-mining", "synthetic"], context={"p": p, "name": name}))
    shutil.rmtree(out / WORK, ignore_errors=True)
    print(f"built {out}: {kept} failures kept from {sampled} images over {len(results)} captions "
          f"({len(with_failures)} with failures); manifest sha256 {manifest.sha256}")
    return 0


def _rows(results, settings, target: str, target_desc: dict, an: bool):
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
