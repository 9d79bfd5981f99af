"""``bench build lance-hardimagenet``: LANCE counterfactuals of the Hard ImageNet validation images (Prabhu et al.,
Algorithm 1; ``docs/builders.md``, LANCE). Rows: ``original``, ``reconstruction`` (the control) and a
``counterfactual`` per accepted edit, joined by ``pair_id``. Three stages over all of a process's images
(:func:`caption_image`, :func:`plan_edits`, :func:`render_image`), each with only its own models loaded.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from genshift import imagenet
from genshift.builders import common
from genshift.builders import lance_perturb as lp
from genshift.builders.common import BuildConfig, ConfigError, option, threaded
from genshift.builders.lance_sources import SourceImage, find_hub_sources, find_sources, load_crop
from genshift.builders.seeding import derive_seed
from genshift.errors import BenchError
from genshift.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)
SUITE_ID = "lance-hardimagenet"
IMAGE_FORMATS = ("jpeg-q75", "png")
WORK = ".work"


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

    from genshift.suites import HARD_IMAGENET_WNIDS

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


def _clip(cfg: Config, device: str):
    from genshift.builders.clip_scoring import ClipScorer

    return ClipScorer.tiny() if cfg.smoke else ClipScorer.from_pretrained(cfg.clip_model, cfg.clip_pretrained,
                                                                           device=device)


def _captioner(cfg: Config, device: str):
    from genshift.builders.captioner import Captioner

    return Captioner.tiny() if cfg.smoke else Captioner.from_pretrained(cfg.captioner, device=device)


def _text_models(cfg: Config, device: str):
    """The perturber and the text filter (the CLIP variant loads its own CLIP: the editor is not loaded yet)."""
    if cfg.smoke:
        return SmokePerturber(), lp.TextFilter.sentence_bert()
    text = lp.TextFilter.sentence_bert() if cfg.text_filter == "sbert" else lp.TextFilter.clip(_clip(cfg, device))
    return lp.Perturber.from_pretrained(cfg.perturber, device=device), text


def _image_models(cfg: Config, device: str, ed):
    from genshift.builders.lance_editor import Editor

    return (Editor.tiny(ed) if cfg.smoke else Editor.from_pretrained(ed, device=device)), _clip(cfg, device)


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

    from genshift.builders.lance_checks import CheckThresholds, choose, score_edits

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


def _save_plan(path: Path, plan: dict) -> None:
    atomic_write_bytes(path, json.dumps(plan).encode())  # NaN stays NaN (a text score), as in the rows


def _type_counts(pairs) -> dict:
    """``{"edit_type": {type: n}, "edit_type_fine": {fine type: n}}`` of (type, fine type) pairs."""
    pairs = list(pairs)
    return {"edit_type": dict(sorted(Counter(t for t, _ in pairs).items())),
            "edit_type_fine": dict(sorted(Counter(f for _, f in pairs).items()))}


@threaded
def run(cfg: Config) -> int:
    import pyarrow as pa
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

    def stage(desc: str, images: list, load, step) -> None:
        if not images:
            return
        models = load()
        for src in tqdm(images, desc=f"lance: {desc}", unit="image", disable=not cfg.progress, dynamic_ncols=True):
            if (plan := step(src, *models)) is not None:
                plans[src.source_id] = plan
                _save_plan(work / f"{src.source_id}.plan.json", plan)
        del models
        common.free(device)

    def rendered(src, editor, clip) -> None:
        plan = plans[src.source_id]
        rows, tried = render_image(src, plan, editor=editor, clip=clip, cfg=cfg)
        models = {k: plan[k] for k in ("captioner", "perturber", "text_filter")} | {"clip": clip.model_id}
        table = pa.Table.from_pylist([{**r, "image": r["image"]["bytes"]} for r in rows])  # + what made them
        common.save_parquet(work / f"{src.source_id}.parquet", table, {"tried": tried, "models": models})

    stage("caption", [s for s in todo if plans[s.source_id] is None], lambda: (_captioner(cfg, device),),
          lambda src, captioner: caption_image(src, captioner=captioner, ed=ed, cfg=cfg))
    stage("edits", [s for s in todo if "kept" not in plans[s.source_id]], lambda: _text_models(cfg, device),
          lambda src, perturber, text_filter: plan_edits(src, plans[src.source_id], perturber=perturber,
                                                         text_filter=text_filter, cfg=cfg))
    stage("images", todo, lambda: _image_models(cfg, device, ed), rendered)
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
