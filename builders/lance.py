"""``bench build lance-hardimagenet``: LANCE counterfactuals of the Hard ImageNet validation images (Prabhu et al.,
Algorithm 1; ``docs/builders.md``, LANCE). Rows: ``original``, ``reconstruction`` (the control) and a
``counterfactual`` per accepted edit, joined by ``pair_id``. Three stages over all of a process's images
(:func:`caption_image`, :func:`plan_edits`, :func:`render_image`), each with only its own models loaded.

Sources: the 750 ImageNet validation images of the 15 Hard ImageNet classes, matched by wnid, from a local folder
or a Hub dataset (``docs/builders.md``, LANCE "Sources"); missing ones reported by wnid.

Image checks (the "checks and balances", Sec. 3.2 and Algorithm 1), with CLIP embeddings of the null-text
reconstruction x (the "original" in the released code's filters), an edit x', the caption c and the edited caption
c': cos(x, x') >= 0.7, cos(x, c) and cos(x', c') >= 0.2, the direction cos(x' - x, c' - c) >= 0.2 (Eq. 2 up to its
sign typo), and x' closer to the edit words than to the removed ones. Of the f values that pass, the highest
directional similarity is kept.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import logging
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from genshift import imagenet
from genshift.builders import common
from genshift.builders import lance_perturb as lp
from genshift.builders.common import BuildConfig, ConfigError, option, threaded
from genshift.builders.seeding import derive_seed
from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes
from genshift.suites import HARD_IMAGENET_WNIDS

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
SUITE_ID = "lance-hardimagenet"
IMAGE_FORMATS = ("jpeg-q75", "png")
WORK = ".work"
PER_CLASS = 50
SUFFIXES = (".jpeg", ".jpg", ".png")


@dataclass(frozen=True)
class SourceImage:
    source_id: str   # the ImageNet val file stem, e.g. ILSVRC2012_val_00000293
    wnid: str
    label: int
    path: Path | None            # a local file, or
    data: bytes | None = None    # the encoded image (from a Hub parquet row)


def _labels_file(root: Path) -> dict[str, str] | None:
    for name in ("LOC_val_solution.csv", "val_labels.txt", "labels.txt"):
        p = next((d / name for d in (root, root.parent) if (d / name).is_file()), None)
        if p is None:
            continue
        out = {}
        if p.suffix == ".csv":
            with open(p, newline="") as f:
                for row in csv.DictReader(f):
                    out[row["ImageId"]] = row["PredictionString"].split()[0]
        else:
            for line in p.read_text().splitlines():
                parts = line.split()
                if len(parts) >= 2:
                    out[Path(parts[0]).stem] = parts[1]
        return out
    return None


def find_sources(root: str | Path, *, wnids=HARD_IMAGENET_WNIDS, per_class: int = PER_CLASS,
                 allow_partial: bool = False) -> list[SourceImage]:
    """The Hard ImageNet validation images under ``root``, sorted by (class order, file name)."""
    root = Path(root)
    if not root.is_dir():
        raise BenchError(f"ImageNet validation folder {str(root)!r} does not exist; pass --imagenet-val DIR")
    def images(folder: Path) -> list[Path]:
        return sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES) if folder.is_dir() else []

    if any((root / w).is_dir() for w in wnids):
        found = {w: images(root / w) for w in wnids}
    else:
        labels = _labels_file(root)
        if labels is None:
            raise BenchError(f"{root} has no <wnid>/ class folders and no labels file (LOC_val_solution.csv or "
                             "'<file> <wnid>' lines); give the validation images in one of those layouts")
        flat = images(root)
        found = {w: [p for p in flat if labels.get(p.stem) == w] for w in wnids}
    _report_missing({w: len(v) for w, v in found.items()}, per_class, allow_partial, "the validation folder")
    return [SourceImage(p.stem, w, imagenet.index_of(w), p) for w in wnids for p in found[w][:per_class]]


def _report_missing(counts: dict[str, int], per_class: int, allow_partial: bool, where: str) -> None:
    missing = [w for w, n in counts.items() if n < per_class]
    if not missing:
        return
    msg = "; ".join(f"{w} ({imagenet.names()[imagenet.index_of(w)]}): {counts[w]}/{per_class}" for w in missing[:6])
    more = f" and {len(missing) - 6} more classes" if len(missing) > 6 else ""
    if not allow_partial:
        raise BenchError(f"{where} is missing Hard ImageNet images: {msg}{more}; complete it or pass --allow-partial")
    log.warning("building from a partial validation set: %s%s", msg, more)


def find_hub_sources(ref: str, *, files: str = "data/validation-*.parquet", wnids=HARD_IMAGENET_WNIDS,
                     per_class: int = PER_CLASS, allow_partial: bool = False, cache_dir: str | None = None,
                     endpoint: str | None = None) -> tuple[list[SourceImage], dict]:
    """The Hard ImageNet validation images of a Hub dataset ``ORG/NAME[@revision]`` (the parquet files matching
    ``files`` at the resolved commit; in file order, the first ``per_class`` of each class), and provenance."""
    import pyarrow.parquet as pq

    from genshift import hubio

    repo_id, _, rev = ref.partition("@")
    if not hubio.is_repo_id(repo_id):
        raise BenchError(f"{repo_id!r} is not a Hub repo id; give --hub-val ORG/NAME[@SHA]")
    sha = hubio.resolve_revision(repo_id, rev or None, endpoint=endpoint, cache_dir=cache_dir,
                                 pin_hint=f"as --hub-val {repo_id}@<sha>")
    root = hubio.snapshot(repo_id, revision=sha, patterns=[files], cache_dir=cache_dir, endpoint=endpoint)
    paths = sorted(root.glob(files))
    if not paths:
        raise BenchError(f"{repo_id}@{sha[:12]} has no files matching {files!r}; pass the validation parquet files "
                         "with --hub-val-files")
    by_index = {imagenet.index_of(w): w for w in wnids}
    found: dict[str, list[SourceImage]] = {w: [] for w in wnids}
    for f in paths:
        pf = pq.ParquetFile(f)
        names = pf.schema_arrow.names
        for col in ("image", "label"):
            if col not in names:
                raise BenchError(f"{f.name} has no {col!r} column (columns: {', '.join(names)}); give an ImageNet "
                                 "validation dataset with image and label columns")
        for g in range(pf.num_row_groups):
            images = None  # read only for a row group that holds a wanted row
            for i, y in enumerate(pf.read_row_group(g, columns=["label"]).column(0).to_pylist()):
                w = by_index.get(y) if isinstance(y, int) else y
                if w not in found or len(found[w]) == per_class:
                    continue
                if images is None:
                    images = pf.read_row_group(g, columns=["image"]).column(0)
                cell = images[i].as_py()
                data, name = (cell.get("bytes"), cell.get("path")) if isinstance(cell, dict) else (cell, None)
                if not data:
                    raise BenchError(f"{f.name}: row {i} of row group {g} has no embedded image bytes; use a dataset "
                                     "with embedded images or --imagenet-val")
                sid = Path(name).stem if name else f"{f.stem}-{g:04d}-{i:05d}"
                found[w].append(SourceImage(sid, w, imagenet.index_of(w), None, data))
    _report_missing({w: len(v) for w, v in found.items()}, per_class, allow_partial, f"{repo_id}@{sha[:12]}")
    return [s for w in wnids for s in found[w]], {"repo_id": repo_id, "revision": sha, "files": files}


def load_crop(src: SourceImage | Path, size: int = 512):
    """Centre square crop + bicubic resize to ``size`` (PIL, as the released code), RGB (grayscale/CMYK converted)."""
    from PIL import Image, UnidentifiedImageError

    where = src if isinstance(src, Path) else (src.path or src.source_id)
    try:
        im = Image.open(src if isinstance(src, Path) else (src.path or io.BytesIO(src.data)))
        im.load()
    except (UnidentifiedImageError, OSError) as e:
        raise BenchError(f"source image {str(where)!r} is not a readable image ({e}); replace it") from None
    im = im.convert("RGB")
    side = min(im.size)
    left, top = (im.width - side) // 2, (im.height - side) // 2
    return im.crop((left, top, left + side, top + side)).resize((size, size), Image.BICUBIC)


@dataclass(frozen=True)
class CheckThresholds:
    image_image: float = 0.7
    image_text: float = 0.2
    direction: float = 0.2
    closer_to_edit: bool = True


@dataclass
class CheckScores:
    f: float
    clip_img_sim: float
    clip_sim_0: float
    clip_sim_1: float
    clip_dir_sim: float
    edit_word_sim: float | None
    original_word_sim: float | None
    passed: bool


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    import torch

    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


def score_edits(scorer, reconstruction, edited: list, fs: list[float], caption: str, edited_caption: str,
                original_words: str, edit_words: str, th: CheckThresholds = CheckThresholds()) -> list[CheckScores]:
    """Scores and the pass/fail verdict of every f of a sweep."""
    e0, *images = scorer.encode_images([reconstruction, *edited])
    texts = [caption, edited_caption, edit_words] + ([original_words] if original_words else [])
    tc, te, tw, *to = scorer.encode_texts(texts)
    out = []
    for f, e in zip(fs, images):
        img, sim0, sim1, direction = _cos(e0, e), _cos(e0, tc), _cos(e, te), _cos(e - e0, te - tc)
        word, original = _cos(e, tw), (_cos(e, to[0]) if to else None)
        passed = (img >= th.image_image and sim0 >= th.image_text and sim1 >= th.image_text
                  and direction >= th.direction and (not th.closer_to_edit or original is None or word > original))
        out.append(CheckScores(f, img, sim0, sim1, direction, word, original, passed))
    return out


def choose(scores: list[CheckScores]) -> CheckScores | None:
    """The passing f with the highest directional similarity, or None."""
    passing = [s for s in scores if s.passed]
    return max(passing, key=lambda s: s.clip_dir_sim) if passing else None


@dataclass(frozen=True)
class Config(BuildConfig):
    """The options of ``bench build lance-hardimagenet`` (defaults: the paper's settings, Table 6)."""

    imagenet_val: str | None = option(None, "ImageNet validation folder (<wnid>/ folders, or flat + "
                                            "LOC_val_solution.csv)")
    hub_val: str | None = option(None, "a Hub ImageNet dataset you have access to, e.g. ILSVRC/imagenet-1k@<sha> "
                                       "(gated: HF_TOKEN)", metavar="ORG/NAME[@SHA]")
    hub_val_files: str = option("data/validation-*.parquet", "glob of its validation parquet files (image + label)")
    allow_partial: bool = option(False, "build from an incomplete validation folder")
    captioner: str = option("Salesforce/blip2-opt-2.7b-coco", "BLIP-2 checkpoint (Hub repo) that captions the images")
    caption_min_length: int = option(20, "minimum caption length (the paper: 'a minimum caption length of 20 words')",
                                     min=0)
    caption_length_unit: str = option("words", "what --caption-min-length counts: words (the paper's text) or tokens "
                                               "(new tokens, as the LAVIS/Table 6 'min length')",
                                      choices=("words", "tokens"))
    perturber: str = option("Qwen/Qwen2.5-7B-Instruct", "an instruction LLM (Table 5 prompts with examples), or "
                                                        "'lance-release': the authors' fine-tuned LLaMA-7B + LoRA from "
                                                        "LANCE-release/checkpoints, converted once (~27 GB)")
    edit_types: tuple[str, ...] = option(lp.EDIT_TYPES, "perturber prompts to run (the fine types; weather is a "
                                         "background edit unless --separate-weather)", choices=lp.EDIT_TYPES)
    separate_weather: bool = option(False, "report weather as a sixth edit_type instead of within background (the "
                                           "paper has five)")
    edit_sampling: str = option("type-uniform", "type-uniform: each draw picks a type uniformly, then one of its "
                                                "edits (Algorithm 1); pool-uniform: a seeded shuffle of all edits (the "
                                                "released code's, unseeded there)", choices=lp.SAMPLING)
    max_edits: int = option(10, "Algorithm 1's N: edits drawn per source image (see --cap-counts)", min=1)
    cap_counts: str = option("tries", "what --max-edits counts: tries (Algorithm 1: N draws, a rejected edit uses its "
                                      "try) or kept (draw until N edits passed the text filter)", choices=lp.CAP_COUNTS)
    image_format: str = option("jpeg-q75", "how images are stored: jpeg-q75 (the files the paper scored, PIL's default "
                                           "JPEG quality 75) or png (lossless)", choices=IMAGE_FORMATS)
    text_filter: str = option("sbert", "text model that rejects edits changing the class", choices=("sbert", "clip"))
    editor: str = option("CompVis/stable-diffusion-v1-4", "Stable Diffusion checkpoint (Hub repo) for null-text "
                                                          "inversion and prompt-to-prompt")
    steps: int = option(50, "diffusion steps per image", min=1)
    guidance: float = option(7.5, "classifier-free guidance scale")
    fs: tuple[float, ...] = option((0.4, 0.5, 0.6, 0.7, 0.8, 0.9), "self-attention injection fractions swept in one "
                                   "pass (the paper's Table 6: 0.4 ... 0.9; the released code: 0.4 ... 0.8)")
    reweight: float = option(2.0, "prompt-to-prompt attention reweighting of the edited words")
    eq_bug_compat: bool = option(False, "reproduce the released code's bug (reweighting only for the first f)")
    clip_model: str = option("ViT-L-14", "open_clip architecture of the CLIP checks")
    clip_pretrained: str = option("openai", "open_clip pretrained tag of --clip-model")
    images_per_shard: int = option(250, "source images per parquet shard", min=1)

    def check(self) -> None:
        if self.imagenet_val and self.hub_val:
            raise ConfigError("hub_val", "give the validation images one way: --imagenet-val DIR or --hub-val")
        if not self.fs or not all(0.0 <= f <= 1.0 for f in self.fs):
            raise ConfigError("fs", f"needs fractions in [0, 1], got {list(self.fs)}")


def _features():
    return common.features(source_image_id="string", role="string", edit_type="string", edit_type_fine="string",
                           edit_sampling_seed="int64", edit_draw="int32", caption="string", edited_caption="string",
                           original_words="string", edit_words="string", f="float64", clip_img_sim="float32",
                           clip_sim_0="float32", clip_sim_1="float32", clip_dir_sim="float32", text_class_sim="float32",
                           text_same_sim="float32", edit_text_direction="float32[]", seed="int64")


def encode_image(img, image_format: str) -> bytes:
    """``jpeg-q75`` as the files the authors' classifiers scored (PIL's default quality), or lossless ``png``."""
    buf = io.BytesIO()
    if image_format == "jpeg-q75":
        img.convert("RGB").save(buf, format="JPEG", quality=75)
    else:
        img.save(buf, format="PNG")
    return buf.getvalue()


class SmokePerturber:
    """Deterministic edits for ``--smoke`` (a random tiny LLM cannot write caption variations)."""

    model_id = "smoke rule-based perturber"

    def perturb(self, caption: str, *, edit_types=("weather", "domain", "background"), **_):
        body = caption[len("a photo of"):] if caption.startswith("a photo of") else None
        answers = {"weather": f"### Variations:\n1. {caption} in the snow\n",
                   "background": f"### Variations:\n1. {caption} on a sunny beach\n",
                   "domain": f"### Variations:\n1. a painting of{body}\n" if body is not None else ""}
        raw = {t: answers[t] for t in edit_types if t in answers}
        return [e for t, a in raw.items() for e in lp.edits_from_answer(caption, t, a)], raw


def _smoke_sources() -> list[SourceImage]:
    """Four scikit-image photographs (PNG bytes), two of each of the first two Hard ImageNet classes."""
    from PIL import Image
    from skimage import data


    photos = [data.chelsea(), data.coffee(), data.astronaut(), data.rocket()]
    wnids = [HARD_IMAGENET_WNIDS[i // 2] for i in range(len(photos))]
    return [SourceImage(f"smoke_{i:04d}", w, imagenet.index_of(w), None, encode_image(Image.fromarray(a), "png"))
            for i, (a, w) in enumerate(zip(photos, wnids))]


def _editor_config(cfg: Config):
    from genshift.builders.lance_editor import EditorConfig

    if cfg.smoke:  # 0.4, 0.6, 0.8: the smoke run stays small
        return EditorConfig(model_id="tiny-random-sd1(seed=0)", steps=4, guidance=cfg.guidance, size=64,
                            nti_inner_steps=3, fs=cfg.fs[::2], reweight=cfg.reweight, eq_bug_compat=cfg.eq_bug_compat)
    return EditorConfig(model_id=cfg.editor, steps=cfg.steps, guidance=cfg.guidance, fs=cfg.fs, reweight=cfg.reweight,
                        eq_bug_compat=cfg.eq_bug_compat)


def load_models(stage: str, cfg: Config, device: str) -> tuple:
    """The models of one stage ("caption", "edits" or "images") and only those: the perturber's CLIP text filter
    loads its own CLIP (the editor is not loaded yet)."""
    from genshift.builders.captioner import Captioner
    from genshift.builders.clip_scoring import ClipScorer
    from genshift.builders.lance_editor import Editor

    def clip():
        return ClipScorer.tiny() if cfg.smoke else ClipScorer.from_pretrained(cfg.clip_model, cfg.clip_pretrained,
                                                                               device=device)
    if stage == "caption":
        return (Captioner.tiny() if cfg.smoke else Captioner.from_pretrained(cfg.captioner, device=device),)
    if stage == "edits" and cfg.smoke:
        return SmokePerturber(), lp.TextFilter.sentence_bert()
    if stage == "edits":
        text = lp.TextFilter.sentence_bert() if cfg.text_filter == "sbert" else lp.TextFilter.clip(clip())
        return lp.Perturber.from_pretrained(cfg.perturber, device=device), text
    ed = _editor_config(cfg)
    return (Editor.tiny(ed) if cfg.smoke else Editor.from_pretrained(ed, device=device)), clip()


def caption_length(cfg: Config) -> dict:
    """The captioner's length settings: Table 6's beam 5 and 100 new tokens at most, the minimum in words
    (the paper's "minimum caption length of 20 words") or in new tokens."""
    if cfg.smoke:
        return {"min_new_tokens": 3, "max_new_tokens": 8}
    if cfg.caption_length_unit == "words":
        return {"min_new_tokens": 0, "min_words": cfg.caption_min_length, "max_new_tokens": 100}
    return {"min_new_tokens": cfg.caption_min_length, "max_new_tokens": 100}


def caption_image(src, *, captioner, ed, cfg: Config) -> dict:
    """Stage 1 of one source image: its caption (BLIP-2, "a photo of ..." on the editor's crop)."""
    caption = captioner.caption([load_crop(src, ed.size)], prefix="a photo of", num_beams=5,
                                seed=derive_seed(cfg.seed, src.source_id, "caption"), **caption_length(cfg))[0]
    return {"caption": caption, "captioner": captioner.model_id}


def plan_edits(src, plan: dict, *, perturber, text_filter, cfg: Config) -> dict:
    """Stage 2 of one source image: the LLM's edits of its caption, drawn through the text filter
    (Algorithm 1, lines 8-11); the kept draws are what stage 3 renders."""
    caption = plan["caption"]
    edits, _raw = perturber.perturb(caption, edit_types=cfg.edit_types,
                                    seed_fn=lambda t: derive_seed(cfg.seed, src.source_id, t))
    class_name = imagenet.get_class(src.label).name
    sampling_seed = derive_seed(cfg.seed, src.source_id, "edit-sampling")
    draws = lp.sample_edits(edits, seed=sampling_seed, max_edits=cfg.max_edits, method=cfg.edit_sampling,
                            cap=cfg.cap_counts, accept=lambda e: text_filter.check(e, class_name),
                            type_of=lambda e: lp.paper_type(e.edit_type, separate_weather=cfg.separate_weather))
    kept = [{"index": d.index, "edit_type": d.edit_type, "edit": asdict(d.edit), "scores": d.scores}
            for d in draws if d.accepted]
    return {**plan, "sampling_seed": sampling_seed, "kept": kept, "perturber": perturber.model_id,
            "text_filter": text_filter.model_id}


def render_image(src, plan: dict, *, editor, clip, cfg: Config) -> tuple[list[dict], list]:
    """Stage 3 of one source image: its rows (original, reconstruction, accepted counterfactuals) from its
    plan: null-text inversion once, prompt-to-prompt for every kept edit, CLIP checks, the best f."""
    import numpy as np

    crop = load_crop(src, editor.cfg.size)
    caption = plan["caption"]
    base = {**dict.fromkeys(_features()), "label": src.label, "pair_id": src.source_id, "keep": True,
            "source_image_id": src.source_id, "caption": caption, "seed": 0,
            "edit_sampling_seed": plan["sampling_seed"]}

    def row(role: str, img, image_id: str, **columns) -> dict:
        return {**base, "image": {"bytes": encode_image(img, cfg.image_format), "path": None},
                "image_id": f"{role}/{image_id}", "config": role, "role": role, **columns}

    inv = editor.null_text_inversion(crop, caption)
    recon = editor.decode(editor.reconstruct(inv))[0]
    rows = [row("original", crop, src.source_id), row("reconstruction", recon, src.source_id)]
    th = CheckThresholds(-1.0, -1.0, -1.0, closer_to_edit=False) if cfg.smoke else CheckThresholds()
    for k, d in enumerate(plan["kept"]):
        e, ts = lp.Edit(**d["edit"]), d["scores"]
        z, _ = editor.edit(inv, e.edited_caption, e.edit)
        images = editor.decode(z[1:])
        scores = score_edits(clip, recon, images, list(editor.cfg.fs), caption, e.edited_caption, e.original, e.edit,
                             th)
        best = choose(scores)
        if best is None:
            continue
        tdir = (clip.encode_texts([e.edit]) - clip.encode_texts([e.original or ""]))[0].cpu().numpy()
        rows.append(row("counterfactual", images[[s.f for s in scores].index(best.f)], f"{src.source_id}/{k:02d}",
                        edit_type=d["edit_type"], edit_type_fine=e.edit_type, edit_draw=d["index"],
                        edited_caption=e.edited_caption, original_words=e.original, edit_words=e.edit, f=best.f,
                        clip_img_sim=best.clip_img_sim, clip_sim_0=best.clip_sim_0, clip_sim_1=best.clip_sim_1,
                        clip_dir_sim=best.clip_dir_sim, text_class_sim=ts["class_sim"], text_same_sim=ts["same_sim"],
                        edit_text_direction=np.asarray(tdir, np.float32).tolist(),
                        seed=derive_seed(cfg.seed, src.source_id, e.edit_type)))
    tried = [[d["edit_type"], d["edit"]["edit_type"]] for d in plan["kept"]]  # sent to the editor: (type, fine type)
    return rows, tried


def _load_plan(path: Path) -> dict | None:
    """An image's checkpointed plan, or None (not made yet, or unreadable: made again)."""
    try:
        plan = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("plan %s is unreadable (%s); making it again", path, e)
        return None
    return plan if isinstance(plan, dict) and isinstance(plan.get("caption"), str) else None


def _type_counts(pairs) -> dict:
    """``{"edit_type": {type: n}, "edit_type_fine": {fine type: n}}`` of (type, fine type) pairs."""
    pairs = list(pairs)
    return {"edit_type": dict(sorted(Counter(t for t, _ in pairs).items())),
            "edit_type_fine": dict(sorted(Counter(f for _, f in pairs).items()))}


@threaded
def run(cfg: Config) -> int:
    import pyarrow as pa
    import torch
    from tqdm.auto import tqdm

    from genshift.data_cards import render_card
    from genshift.distributed import current_process, shard_of

    out = Path(cfg.out)
    proc = current_process()
    device = proc.device(cfg.device, cpu=cfg.smoke)  # each accelerate process on its node-local GPU
    hub_source = None
    if cfg.smoke:
        sources = _smoke_sources()
    elif cfg.imagenet_val:
        sources = find_sources(cfg.imagenet_val, allow_partial=cfg.allow_partial)
    elif cfg.hub_val:
        sources, hub_source = find_hub_sources(cfg.hub_val, files=cfg.hub_val_files, allow_partial=cfg.allow_partial)
    else:
        raise BenchError("give the ImageNet validation images with --imagenet-val DIR or --hub-val ORG/NAME[@SHA] "
                         "(or --smoke)")
    skip = ("progress", "overwrite", "device", "hub_val", "out", "imagenet_val")  # hub_source: the resolved commit
    fingerprint = {k: v for k, v in asdict(cfg).items() if k not in skip} | {"hub_source": hub_source}
    writer = common.open_writer(cfg, proc, suite_id=SUITE_ID, extra_features=_features(), fingerprint=fingerprint)
    if writer is None:
        return 0
    ed = _editor_config(cfg)
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    todo = [s for s in sources if shard_of(s.source_id, proc.count) == proc.index
            and not (work / f"{s.source_id}.parquet").is_file()]
    # three stages over all of this process's images, each with only its own models loaded (the four
    # together do not fit a 24 GiB GPU; docs/performance.md); each image's plan is checkpointed per stage
    plans = {s.source_id: _load_plan(work / f"{s.source_id}.plan.json") for s in todo}

    def stage(desc: str, images: list, step) -> None:
        if not images:
            return
        models = load_models(desc, cfg, device)
        for src in tqdm(images, desc=f"lance: {desc}", unit="image", disable=not cfg.progress, dynamic_ncols=True):
            if (plan := step(src, *models)) is not None:
                plans[src.source_id] = plan
                # NaN stays NaN (a text score), as in the rows
                atomic_write_bytes(work / f"{src.source_id}.plan.json", json.dumps(plan).encode())
        del models  # given back before the next stage loads its own
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()

    def rendered(src, editor, clip) -> None:
        plan = plans[src.source_id]
        rows, tried = render_image(src, plan, editor=editor, clip=clip, cfg=cfg)
        models = {k: plan[k] for k in ("captioner", "perturber", "text_filter")} | {"clip": clip.model_id}
        table = pa.Table.from_pylist([{**r, "image": r["image"]["bytes"]} for r in rows])  # + what made them
        common.save_parquet(work / f"{src.source_id}.parquet", table, {"tried": tried, "models": models})

    stage("caption", [s for s in todo if plans[s.source_id] is None],
          lambda src, captioner: caption_image(src, captioner=captioner, ed=ed, cfg=cfg))
    stage("edits", [s for s in todo if "kept" not in plans[s.source_id]],
          lambda src, perturber, text_filter: plan_edits(src, plans[src.source_id], perturber=perturber,
                                                         text_filter=text_filter, cfg=cfg))
    stage("images", todo, rendered)
    proc.wait()
    if not proc.is_main:
        return 0
    by_config: dict[str, list] = {"original": [], "reconstruction": [], "counterfactual": []}
    tried_all: list = []
    models: set[str] = set()
    for s in sources:
        rows, meta = common.load_parquet(work / f"{s.source_id}.parquet")
        tried_all += meta.get("tried", [])
        models.add(json.dumps(meta.get("models", {}), sort_keys=True))
        for r in rows:
            by_config[r["config"]].append({**r, "image": {"bytes": r["image"], "path": None}})
    used = json.loads(models.pop()) if len(models) == 1 else {}
    if set(used) != {"captioner", "perturber", "text_filter", "clip"}:  # before any shard is written
        raise BenchError(f"the images checkpointed in {work} were made with different models or by an older version "
                         "of this builder; build again with --overwrite")
    if not by_config["counterfactual"]:
        raise BenchError("no counterfactual passed the checks; nothing to evaluate (check the models and thresholds)")
    for config, rows in by_config.items():
        n = max(1, -(-len(rows) // cfg.images_per_shard))
        for i in range(n):
            if not writer.shard_done(config, i, n):
                writer.write_shard(config, i, n, rows[i::n])
    counts = {c: len(r) for c, r in by_config.items()}
    unit = "tokens" if cfg.smoke else cfg.caption_length_unit
    p = {"builder": "genshift.builders.lance", "paper": "Prabhu et al., LANCE (NeurIPS 2023)",
         "captioner": used["captioner"], "caption_length": {"unit": unit, **caption_length(cfg), "beams": 5},
         "perturber": used["perturber"], "text_filter": used["text_filter"],
         "editor": asdict(ed), "clip": used["clip"], "seed": cfg.seed, "edit_types": list(cfg.edit_types),
         "max_edits": cfg.max_edits, "image_format": cfg.image_format,
         "edit_sampling": lp.sampling_record(cfg.edit_sampling, separate_weather=cfg.separate_weather,
                                             cap=cfg.cap_counts),
         "edits_tried": _type_counts(tried_all),
         "counterfactuals": _type_counts((r["edit_type"], r["edit_type_fine"]) for r in by_config["counterfactual"]),
         "determinism": common.provenance(cfg.cpu_threads, device), "smoke_relaxed_thresholds": cfg.smoke,
         "eq_bug_compat": cfg.eq_bug_compat, "counts": counts, "sources": len(sources),
         "source_dataset": hub_source or ("local ImageNet validation folder" if cfg.imagenet_val else "smoke")}
    manifest = writer.finalize(generator=p, card=lambda m: render_card(
        m, template="lance", license="other", gated=True,
        pretty_name="LANCE counterfactuals of Hard ImageNet (genshift-bench rebuild)",
        tags=["lance", "counterfactual", "hard-imagenet"], context={"p": p, "json": json.dumps}))
    shutil.rmtree(work, ignore_errors=True)
    print(f"built {out}: {counts}; manifest sha256 {manifest.sha256}")
    return 0
