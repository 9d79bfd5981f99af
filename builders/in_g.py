"""``bench build in-g-rn | in-g-vit``: generated images that fool a ResNet-50 / ViT-B/16 (Wiles, Albuquerque, Gowal),
an open re-creation with substitutes (``docs/builders.md``, IN-G).

Class prompts: the class prompt with the WordNet 3.0 grandparent of smallest offset (``genshift.imagenet``); a seed
caption is the class prompt and at most two generated sentences, lower-cased, from a captioner continuing the prompt
or from a CSV/JSONL file. Failure mining (s4.2): per seed caption, images (seeds from the caption id) until ``cap``
fail by the paper's definition (none of the top-3 under the true class's WordNet parent:
``genshift.eval.metrics.parent_failures``) or ``n_max`` were sampled; each caption's outcome is checkpointed, so
mining is resumable per caption and spread over ``accelerate`` processes by caption id; the main process writes the
suite.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from genshift import imagenet
from genshift.builders import common
from genshift.builders.common import BuildConfig, ConfigError, load_parquet, option, save_parquet, threaded
from genshift.builders.seeding import derive_seed
from genshift.errors import BenchError
from genshift.eval.metrics import parent_failures
from genshift.fsutil import atomic_write_bytes, sha256_file

TEMPLATE = "a realistic photograph of {article} {name} ({parent})."
CAPTIONING = ("three-shot", "single-image")  # the paper's few-shot prompt (shots()), or the image alone
DECODING = {"num_beams": 5, "min_new_tokens": 8, "max_new_tokens": 40}  # the IN-G captioner's


@dataclass(frozen=True)
class ClassPrompt:
    label: int
    wnid: str
    name: str
    parent_wnid: str
    parent_name: str
    text: str


def class_prompt(label: int, *, an: bool = False) -> ClassPrompt:
    c = imagenet.get_class(label)
    if c.parent is None:
        raise BenchError(f"class {label} ({c.wnid}) has no WordNet grandparent in the shipped hierarchy; it cannot "
                         "be given an IN-G prompt")
    parent = imagenet.synset_name(c.parent)
    article = "an" if an and c.lemma[:1].lower() in "aeiou" else "a"
    return ClassPrompt(label, c.wnid, c.lemma, c.parent, parent,
                       TEMPLATE.format(article=article, name=c.lemma, parent=parent))


def seed_caption(prompt: str, continuation: str, *, max_sentences: int = 2) -> str:
    """Class prompt + at most ``max_sentences`` generated sentences, lower-cased."""
    cont = continuation.strip()
    if cont.lower().startswith(prompt.lower()):
        cont = cont[len(prompt):].strip()
    sentences = [s.strip(" .") for s in re.split(r"(?<=\.)\s+", cont) if s.strip(" .")]
    tail = " ".join(f"{s.lower()}." for s in sentences[:max_sentences])
    return f"{prompt} {tail}".strip()


def check_caption(label: int, caption: str, *, an: bool = False) -> str:
    """A caption must start with its class prompt (the paper forces it); one clear error otherwise."""
    prompt = class_prompt(label, an=an).text
    if not caption.lower().startswith(prompt.lower()):
        raise BenchError(f"caption {caption[:60]!r} for class {label} does not start with its class prompt "
                         f"{prompt!r}; IN-G captions continue the class prompt")
    return caption


def _label(text, where: str) -> int:
    try:
        return imagenet.parse_class(text)
    except BenchError as e:
        raise BenchError(f"{where}: {e}") from None


def read_captions(path: str | Path, *, an: bool = False) -> list[tuple[int, str]]:
    """Seed captions from a CSV (class,caption) or JSONL file; each must continue its class prompt."""
    path = Path(path)
    if not path.is_file():
        raise BenchError(f"caption file {str(path)!r} does not exist")
    rows: list[tuple[int, str]] = []
    if path.suffix == ".jsonl":
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rows.append((_label(obj["class"], f"{path.name}:{i}"), str(obj["caption"])))
            except (ValueError, KeyError, TypeError) as e:
                raise BenchError(f"{path.name}:{i}: expected {{\"class\": ..., \"caption\": ...}} ({e})") from None
    else:
        with open(path, newline="") as f:
            for i, row in enumerate(csv.reader(f), 1):
                if not row or (i == 1 and row[0].strip().lower() == "class"):
                    continue
                if len(row) < 2:
                    raise BenchError(f"{path.name}:{i}: expected 'class,caption'")
                rows.append((_label(row[0], f"{path.name}:{i}"), row[1]))
    if not rows:
        raise BenchError(f"caption file {path} holds no captions")
    return [(y, check_caption(y, c.strip(), an=an)) for y, c in rows]


def shots() -> tuple[list, list[dict]]:
    """The captioner's three shots (package data ``in_g_shots.yaml``): ``[(PIL image, caption)]`` and
    their record for the suite's provenance (image file, its sha256, caption)."""
    import hashlib
    from importlib import resources

    import yaml
    from PIL import Image

    data = resources.files("genshift.builders").joinpath("_data")
    out, record = [], []
    for s in yaml.safe_load(data.joinpath("in_g_shots.yaml").read_text()):
        raw = data.joinpath(s["image"]).read_bytes()
        out.append((Image.open(io.BytesIO(raw)).convert("RGB"), s["caption"]))
        record.append({"image": s["image"], "sha256": hashlib.sha256(raw).hexdigest(), "caption": s["caption"]})
    return out, record


def caption_batch(n_shots: int) -> int:
    """Images captioned per call: 16 images through the vision model per call, shots included (three-shot: 4),
    so that three-shot captioning needs about the memory of single-image captioning (``bench build --preflight``)."""
    return 16 // (1 + n_shots)


def captioner_fn(captioner, shots: Sequence = ()) -> Callable[[list, str], list[str]]:
    """``caption(images, class prompt) -> texts`` by a :class:`~genshift.builders.captioner.Captioner` with the
    IN-G decoding and ``shots`` (:func:`shots`) before each image; images are files or encoded bytes."""
    from PIL import Image

    batch = caption_batch(len(shots))

    def caption(images: list, prefix: str) -> list[str]:
        out = []
        for a in range(0, len(images), batch):
            pil = [Image.open(io.BytesIO(im) if isinstance(im, bytes) else im) for im in images[a:a + batch]]
            out += captioner.caption(pil, prefix=prefix, shots=shots, **DECODING)
        return out

    return caption


Generate = Callable[[list[str], list[int]], list[bytes]]
Classify = Callable[[list[bytes]], np.ndarray]  # (n, 1000) probabilities


@dataclass(frozen=True)
class MiningConfig:
    n_max: int = 1000   # images sampled per caption at most (the paper's "up to a thousand")
    cap: int = 2        # failures kept per caption (the paper's cap is unknown; recorded)
    batch_size: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise BenchError(f"cap must be at least 1 (failures kept per caption), got {self.cap}")
        if self.n_max < self.cap:
            raise BenchError(f"n_max ({self.n_max}) is smaller than cap ({self.cap}); a caption could never fill "
                             "its cap")


def caption_id(label: int, caption: str, occurrence: int = 0) -> str:
    """The id of a caption; a caption seen again (another image gave the same text) gets its own id,
    hence its own seeds: each seed caption is mined, as the paper mines every image's caption."""
    text = caption if occurrence == 0 else f"{caption}#{occurrence}"
    return f"{label:03d}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass
class Attempt:
    index: int
    seed: int
    image: bytes = field(repr=False)
    top5_idx: list[int]
    top5_prob: list[float]
    top1_miss: bool
    top3_miss: bool
    parent_failure: bool


@dataclass
class CaptionResult:
    caption_id: str
    label: int
    caption: str
    sampled: int
    kept: list[Attempt]

    def save(self, path: Path) -> None:
        import pyarrow as pa

        schema = pa.schema([("index", pa.int32()), ("seed", pa.int64()), ("image", pa.binary()),
                            ("top5_idx", pa.list_(pa.int16())), ("top5_prob", pa.list_(pa.float32())),
                            ("top1_miss", pa.bool_()), ("top3_miss", pa.bool_()), ("parent_failure", pa.bool_())])
        table = pa.Table.from_pylist([asdict(a) for a in self.kept], schema=schema)
        save_parquet(path, table, {"caption": {"caption_id": self.caption_id, "label": self.label,
                                               "caption": self.caption, "sampled": self.sampled}})

    @classmethod
    def load(cls, path: Path) -> CaptionResult:
        rows, meta = load_parquet(path)
        c = meta["caption"]
        return cls(c["caption_id"], c["label"], c["caption"], c["sampled"], [Attempt(**r) for r in rows])


def mine_caption(label: int, caption: str, *, generate: Generate, classify: Classify, cfg: MiningConfig,
                 cid: str | None = None) -> CaptionResult:
    """Sample until ``cfg.cap`` failures are kept or ``cfg.n_max`` images were sampled."""
    cid = cid or caption_id(label, caption)
    kept: list[Attempt] = []
    sampled = 0
    while sampled < cfg.n_max and len(kept) < cfg.cap:
        n = min(cfg.batch_size, cfg.n_max - sampled)
        seeds = [derive_seed(cfg.seed, cid, sampled + j) for j in range(n)]
        images = generate([caption] * n, seeds)
        probs = np.asarray(classify(images), dtype=np.float64)
        top5 = np.argsort(-probs, axis=1, kind="stable")[:, :5]
        fail = parent_failures(np.full(n, label), top5[:, :3])
        for j in np.flatnonzero(fail)[:cfg.cap - len(kept)].tolist():
            kept.append(Attempt(index=sampled + j, seed=seeds[j], image=images[j],
                                top5_idx=top5[j].tolist(), top5_prob=probs[j, top5[j]].astype(np.float32).tolist(),
                                top1_miss=bool(top5[j, 0] != label), top3_miss=bool(label not in top5[j, :3]),
                                parent_failure=True))
        sampled += n
    return CaptionResult(cid, label, caption, sampled, kept)


def mine_all(captions: Sequence[tuple[int, str]], work_dir: Path, *, generate: Generate, classify: Classify,
             cfg: MiningConfig, owns: Callable[[str], bool] = lambda cid: True, progress: bool = True
             ) -> dict[str, CaptionResult]:
    """Mine every caption this process owns, resuming from checkpoints in ``work_dir``."""
    from tqdm.auto import tqdm

    work_dir.mkdir(parents=True, exist_ok=True)
    out, todo = {}, []
    seen: Counter = Counter()
    for label, caption in captions:
        cid = caption_id(label, caption, seen[label, caption])
        seen[label, caption] += 1
        if not owns(cid):
            continue
        ckpt = work_dir / f"{cid}.parquet"
        if ckpt.is_file():
            out[cid] = CaptionResult.load(ckpt)
        else:
            todo.append((label, caption, ckpt, cid))
    bar = tqdm(todo, desc="mine", unit="caption", disable=not progress, dynamic_ncols=True)
    for label, caption, ckpt, cid in bar:
        res = mine_caption(label, caption, generate=generate, classify=classify, cfg=cfg, cid=cid)
        res.save(ckpt)
        out[res.caption_id] = res
        bar.set_postfix(kept=sum(len(r.kept) for r in out.values()))
    return out


def classifier_from_timm(model_name: str, *, device: str = "cpu", checkpoint: str | None = None,
                         pretrained: bool = True, batch_size: int = 64) -> tuple[Classify, dict]:
    """A ``classify`` function over JPEG bytes with the target's own timm eval transform."""
    import torch
    from PIL import Image

    from genshift.eval.models import load_classifier

    clf = load_classifier(model_name, checkpoint=checkpoint, device=device, pretrained=pretrained)

    @torch.inference_mode()
    def classify(images: list[bytes]) -> np.ndarray:
        outs = []
        for a in range(0, len(images), batch_size):
            x = torch.stack([clf.transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in images[a:a + batch_size]])
            outs.append(clf.model(x.to(device)).float().softmax(-1).cpu().numpy())
        return np.concatenate(outs)

    return classify, clf.describe()


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
