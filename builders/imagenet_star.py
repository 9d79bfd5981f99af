"""``bench build imagenet-star``: regenerate ImageNet* (Vendrow et al., Dataset Interfaces; ``docs/builders.md``).

Every process generates and CLIP-scores its shards into ``<out>/.stage/``; the main process then calibrates
each shift's ``keep`` thresholds and writes the final shards and manifest. The CLIP quality filter: class and shift
presence scores (cosine of normalised open_clip embeddings, no logit scale), and a ``keep`` rule :func:`calibrate`d
to the kept fraction per shift of the authors' released masks (their rule is unknown). Thresholds are recorded
unrounded.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from importlib import resources
from pathlib import Path

import numpy as np
import yaml

from genshift import imagenet
from genshift.builders import common
from genshift.builders.common import BuildConfig, ConfigError, option, threaded
from genshift.builders.seeding import derive_seed
from genshift.distributed import current_process, plan_nonempty_shards
from genshift.errors import BenchError, unknown
from genshift.fsutil import sha256_file
from genshift.suites import imagenet_star_shifts

SUITE_ID = "imagenet-star"
STAGE = ".stage"
TOKENS_WORK = ".tokens"
SMOKE_CLASSES = (0, 207)  # tench, Golden Retriever (a name with a space and capitals)
SMOKE_MODEL = "tiny-random-sd2(seed=0)"


@lru_cache(maxsize=1)
def released_kept_counts() -> tuple[int, dict[str, int]]:
    """(images per shift, {shift: kept}) of the authors' released masks (package data)."""
    raw = yaml.safe_load(resources.files("genshift.builders").joinpath("_data", "imagenet_star_released_masks.yaml")
                         .read_text())
    return int(raw["images_per_shift"]), {k: int(v) for k, v in raw["kept"].items()}


# Kept fraction per shift in the authors' released masks.npy (exact: kept / 50000).
RELEASED_KEPT_FRACTION = {k: v / released_kept_counts()[0] for k, v in released_kept_counts()[1].items()}


def shift_caption(prompt: str) -> str | None:
    """The shift-presence caption of a shift prompt; ``None`` for the plain base prompt."""
    caption = prompt.replace("<TOKEN>", "thing")
    return None if caption == "a photo of a thing" else caption


def clip_scores(scorer, images, class_names: Sequence[str], prompts: Sequence[str]) -> dict[str, np.ndarray]:
    """Class and shift presence scores and image embeddings for a batch (PIL images)."""
    from genshift.builders.clip_scoring import cosine

    img = scorer.encode_images(images)
    cls = scorer.encode_texts([f"a photo of a {n}" for n in class_names])
    caps = [shift_caption(p) for p in prompts]
    shift = np.full(len(images), np.nan, dtype=np.float32)
    idx = [i for i, c in enumerate(caps) if c is not None]
    if idx:
        shift[idx] = cosine(img[idx], scorer.encode_texts([caps[i] for i in idx])).cpu().numpy()
    return {"class_score": cosine(img, cls).cpu().numpy().astype(np.float32), "shift_score": shift,
            "embedding": img.cpu().numpy().astype(np.float32)}


@dataclass(frozen=True)
class Thresholds:
    """One shift's calibrated thresholds (``None`` = no gate)."""

    class_threshold: float
    shift_threshold: float | None = None


def kept_target(n: int, fraction: float) -> int:
    """``floor(n f)``, robust to the float error of ``n f`` (50000 x 46316/50000 is 46316)."""
    return min(n, math.floor(n * fraction + 1e-9))


def calibrate(class_scores: Mapping[str, np.ndarray], target: Mapping[str, float], *, rule: str = "class",
              shift_scores: Mapping[str, np.ndarray] | None = None, shift_quantile: float = 0.1
              ) -> dict[str, Thresholds]:
    """Per-shift thresholds that keep ``floor(n f)`` of each shift's ``n`` images (distinct scores), ``f`` =
    ``target[shift]``. ``class``: keep iff the class score >= ``T_class``, the ``ceil(n (1 - f))``-th smallest
    (0-based). ``class+shift``: a gate first drops the ``shift_quantile`` of the images with the lowest shift
    score (NaN, as ``base``'s, is never gated); ``T_class`` is calibrated on the images that pass it.
    The keep rule, the gate quantile and every shift's target come checked from the builder's config."""
    out = {}
    for shift, cs in class_scores.items():
        cs = np.asarray(cs, dtype=np.float64)
        k = kept_target(cs.size, float(target[shift]))
        gate, passing = None, np.ones(cs.size, dtype=bool)
        ss = None if shift_scores is None else np.asarray(shift_scores[shift], dtype=np.float64)
        if rule == "class+shift" and ss is not None and cs.size and not np.isnan(ss).all():
            drop = math.floor(cs.size * shift_quantile + 1e-9)
            gate = float(np.sort(ss)[drop]) if drop < cs.size else math.inf
            passing = ss >= gate
            if passing.sum() < k:
                raise BenchError(f"shift {shift!r}: the shift gate leaves {int(passing.sum())} images but the target "
                                 f"keeps {k}; lower --shift-gate-quantile (now {shift_quantile})")
        kept = np.sort(cs[passing])  # the lowest threshold keeping at most k (>=): the (n-k)-th smallest
        out[shift] = Thresholds(float(kept[kept.size - k]) if k > 0 else math.inf, gate)
    return out


def keep_flags(class_score: np.ndarray, shift_score: np.ndarray, thresholds: Thresholds) -> np.ndarray:
    """The keep rule applied to one shift's scores (NaN shift scores are never gated)."""
    keep = np.asarray(class_score, dtype=np.float64) >= thresholds.class_threshold
    if thresholds.shift_threshold is not None:
        s = np.asarray(shift_score, dtype=np.float64)
        keep &= np.isnan(s) | (s >= thresholds.shift_threshold)
    return keep


@dataclass(frozen=True)
class Config(BuildConfig):
    """The options of ``bench build imagenet-star`` (defaults: the authors' settings)."""

    shifts: tuple[str, ...] = option((), "shift keys (default: base + the 23 shifts; --smoke: base, in_the_snow)")
    shifts_file: str | None = option(None, "YAML prompt table (list of {key, prompt, group, status}) to use instead")
    classes: tuple[str, ...] = option((), "class indices or wnids, or a range like 0-99 (default: all 1000)")
    samples_per_class: int = option(50, "images generated per class and shift (--smoke: 2)", min=1)
    images_per_shard: int = option(2500, "sets the number of shards per shift", min=1)
    num_shards: int | None = option(None, "shards per shift (overrides --images-per-shard)", min=1)
    tokens: str = option("hub", "class tokens: 'hub' (the released madrylab/imagenet-star-tokens tokens.zip, sha256-"
                                "checked), a tokens.zip / token folder, or 'none' (class names)")
    train_tokens: str | None = option(None, "train tokens by textual inversion on DIR/<wnid>/ images", metavar="DIR")
    tokens_only: bool = option(False, "with --train-tokens: write <out>/tokens.zip once every class is trained, and "
                                      "stop (no generation)")
    ti_steps: int = option(3000, "textual-inversion steps per class (--train-tokens)", min=1)
    ti_lr: float = option(5e-4, "textual-inversion learning rate (--train-tokens)")
    model: str = option("stabilityai/stable-diffusion-2", "Stable Diffusion checkpoint (Hub repo) of the generator")
    model_revision: str | None = option(None, "commit sha to pin (recommended; default: main, resolved sha recorded)")
    variant: str = option("fp16", "Hub weight variant (fp16 = the authors' weights, half download)")
    steps: int = option(50, "diffusion steps per image", min=1)
    guidance: float = option(7.5, "classifier-free guidance scale")
    height: int = option(768, "generated image height in pixels", min=8)
    width: int = option(768, "generated image width in pixels", min=8)
    output_size: int = option(512, "stored image size in pixels (resized from the generated size)", min=1)
    jpeg_quality: int = option(75, "PIL's default, as the upstream release (~45-57 KB per 512 px image)", min=1)
    dtype: str = option("float16", "generator weights dtype", choices=("float16", "bfloat16", "float32"))
    batch_size: int = option(8, "images per generation batch", min=1)
    clip_model: str = option("ViT-H-14", "open_clip architecture of the presence filter")
    clip_pretrained: str = option("laion2b_s32b_b79k", "open_clip pretrained tag of --clip-model")
    keep_rule: str = option("class", "class: class presence >= per-shift threshold; class+shift: also a "
                                     "shift-presence gate", choices=("class", "class+shift"))
    shift_gate_quantile: float = option(0.1, "class+shift: fraction of each shift's images the shift-presence gate "
                                             "removes")
    kept_fractions: str | None = option(None, "JSON {shift: fraction} targets (default: the released masks' fractions)")
    wait_timeout: float = option(4 * 3600, "multi-process: seconds the main process waits for a new staged shard "
                                           "before giving up")

    def check(self) -> None:
        if self.train_tokens and self.tokens != "hub":
            raise ConfigError("train_tokens", "give class tokens one way: --tokens FILE|none or --train-tokens DIR")
        if self.tokens_only and not self.train_tokens:
            raise ConfigError("tokens_only", "writes the tokens trained with --train-tokens DIR; give that too")
        if not 0.0 <= self.shift_gate_quantile < 1.0:
            raise ConfigError("shift_gate_quantile", f"must be in [0, 1), got {self.shift_gate_quantile}")


def parse_classes(items) -> list[int]:
    if not items:
        return list(range(imagenet.NUM_CLASSES))
    out = []
    for it in items:
        if "-" in it and it.replace("-", "").isdigit():
            a, b = (int(x) for x in it.split("-"))
            out += list(range(a, b + 1))
        else:
            out.append(imagenet.parse_class(it))
    bad = [c for c in out if not 0 <= c < imagenet.NUM_CLASSES]
    if bad:
        raise ConfigError("classes", f"{bad[0]} is not an ImageNet-1k class index (0..999)")
    return sorted(set(out))


def shift_table(cfg: Config) -> dict[str, str]:
    if cfg.shifts_file:
        try:
            table = {r["key"]: r["prompt"] for r in yaml.safe_load(Path(cfg.shifts_file).read_text())}
        except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
            raise ConfigError("shifts_file", f"{cfg.shifts_file!r}: expected a YAML list of {{key, prompt}} "
                                             f"({e})") from None
    else:
        table = {s.key: s.prompt for s in imagenet_star_shifts()}
    for key, prompt in table.items():
        if "<TOKEN>" not in prompt:
            raise ConfigError("shifts_file", f"shift {key!r}: prompt {prompt!r} has no <TOKEN> placeholder")
    for s in cfg.shifts:
        if s not in table:
            raise unknown("shift", s, table)
    return {s: table[s] for s in cfg.shifts or (("base", "in_the_snow") if cfg.smoke else table)}


def kept_fractions(cfg: Config, shifts) -> dict[str, float]:
    table = dict(RELEASED_KEPT_FRACTION)
    if cfg.kept_fractions:
        try:
            table.update({k: float(v) for k, v in json.loads(Path(cfg.kept_fractions).read_text()).items()})
        except (OSError, ValueError, AttributeError) as e:
            raise ConfigError("kept_fractions", f"{cfg.kept_fractions!r}: expected a JSON object shift -> fraction "
                                                f"({e})") from None
    missing = [s for s in shifts if s not in table]
    if missing:
        raise ConfigError("kept_fractions", f"no target kept fraction for shift(s) {', '.join(missing)}")
    bad = {s: table[s] for s in shifts if not 0.0 <= table[s] <= 1.0}
    if bad:
        raise ConfigError("kept_fractions", f"fractions must be in [0, 1], got {bad}")
    return {s: table[s] for s in shifts}


def generation_settings(cfg: Config):
    from genshift.builders.sd_generate import GenerationSettings

    shared = dict(scheduler="euler", guidance=cfg.guidance, jpeg_quality=cfg.jpeg_quality)
    if cfg.smoke:
        return GenerationSettings(model_id=SMOKE_MODEL, steps=2, height=64, width=64, output_size=32, dtype="float32",
                                  batch_size=min(cfg.batch_size, 4), **shared)
    return GenerationSettings(model_id=cfg.model, revision=cfg.model_revision, steps=cfg.steps, height=cfg.height,
                              width=cfg.width, output_size=cfg.output_size, dtype=cfg.dtype, batch_size=cfg.batch_size,
                              variant=cfg.variant, **shared)


def token_source(cfg: Config, classes: list[int]) -> tuple[str, str | None, dict | None]:
    """(kind, path, tokens) of the class tokens; a released or given file is loaded and validated here,
    before anything heavy is."""
    from genshift.builders.textual_inversion import download_released_tokens, load_token_zip

    if cfg.smoke or cfg.tokens == "none":
        return ("smoke" if cfg.smoke else "none"), None, None
    if cfg.train_tokens:
        return "trained", cfg.train_tokens, None
    path = str(download_released_tokens()) if cfg.tokens == "hub" else cfg.tokens
    return ("released" if cfg.tokens == "hub" else "file"), path, load_token_zip(path, classes=classes)


def _smoke_training_images(root: Path, classes: list[int]) -> Path:
    """Two tiny synthetic images per class (distinct colours), as ``<wnid>/<i>.png``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in classes:
        d = root / imagenet.wnids()[c]
        d.mkdir(parents=True, exist_ok=True)
        colour = rng.integers(0, 256, 3)
        for i in range(2):
            pixels = np.clip(colour + rng.normal(0, 12, (40, 48, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(d / f"{i}.png")
    return root


def _train(cfg: Config, run, classes: list[int], root: Path, data, what: str, *, steps: int, lr: float,
           resolution: int, model_id: str) -> tuple[dict, dict]:
    """Tokens of ``classes`` by textual inversion, split over the processes (every process gets all; resumable in
    ``root/.tokens``), written to ``root/tokens.zip``; returns them and their provenance (``what`` they are)."""
    from genshift.builders.textual_inversion import TIConfig, folder_classes, save_token_zip, train_tokens

    ti, work = TIConfig(steps=steps, lr=lr, resolution=resolution), root / TOKENS_WORK
    tokens = train_tokens(data, work, run, ti, classes=classes, model_id=model_id, process=current_process(),
                          progress=cfg.progress)
    if len(tokens) < len(classes):  # other processes train the rest: wait for their files
        common.wait_for(lambda: [c for c in classes if not (work / f"{c}.bin").is_file()], "class token(s)",
                        cfg.wait_timeout)
        tokens = train_tokens(data, work, run, ti, classes=classes, model_id=model_id, progress=False)
    save_token_zip(tokens, root / "tokens.zip")
    used = [f for c in folder_classes(data, classes=classes) for f in c.files]
    return tokens, {"tokens": what, "tokens_sha256": sha256_file(root / "tokens.zip"), "textual_inversion": {
        "steps": steps, "lr": lr, "resolution": resolution, "model": model_id, "data": common.files_digest(data, used),
        "settings": "genshift.builders.textual_inversion.TIConfig defaults otherwise"}}


def _load_models(cfg: Config, settings, classes: list[int], device: str, token_kind: str, token_path: str | None,
                 tokens: dict | None):
    """(generator, CLIP scorer, token provenance); ``tokens`` = the loaded released/file tokens."""
    from genshift.builders.clip_scoring import ClipScorer
    from genshift.builders.sd_generate import SDGenerator
    from genshift.builders.textual_inversion import TIRun, load_token_zip, tokens_digest

    out = Path(cfg.out)
    if token_kind == "smoke":  # a few textual-inversion steps on synthetic images, then the real token path
        from genshift.builders.real_models import tiny_sd_components

        data = _smoke_training_images(out / STAGE / "smoke-images", classes)
        run = TIRun.from_components(tiny_sd_components(), "cpu")
        _, info = _train(cfg, run, classes, out / STAGE, data, "textual inversion on synthetic images (smoke)",
                         steps=2, lr=5e-3, resolution=32, model_id=SMOKE_MODEL)
        tokens = load_token_zip(out / STAGE / "tokens.zip", dim=None, classes=classes)
        return SDGenerator.tiny(settings, tokens=tokens), ClipScorer.tiny(), info
    info = {"tokens": None}
    if token_kind in ("released", "file"):
        name = "madrylab/imagenet-star-tokens tokens.zip" if token_kind == "released" else Path(token_path).name
        info = {"tokens": name, "tokens_sha256": tokens_digest(token_path)}
    elif token_kind == "trained":
        base = SDGenerator.from_pretrained(settings, device=device)
        run = TIRun.from_components(base.pipe.components, device)
        tokens, info = _train(cfg, run, classes, out, token_path, "trained here (tokens.zip)", steps=cfg.ti_steps,
                              lr=cfg.ti_lr, resolution=cfg.height, model_id=settings.model_id)
        del base, run
        if cfg.tokens_only:
            return None, None, info
    gen = SDGenerator.from_pretrained(settings, device=device, tokens=tokens)
    return gen, ClipScorer.from_pretrained(cfg.clip_model, cfg.clip_pretrained, device=device), info


def _shard_rows(items, shift, prompt, gen, clip, seed: int, token_names, bar, record_batch_size):
    """Generate, score and yield the rows of one shard, in batches; then record the batch size
    (this runs before the shard's file is renamed into place)."""
    from PIL import Image

    fixed = {"generator": gen.settings.model_id, "generator_revision": gen.resolved_revision,
             "scheduler": type(gen.pipe.scheduler).__name__, "steps": gen.settings.steps,
             "guidance": gen.settings.guidance}
    for a in range(0, len(items), gen.settings.batch_size):
        chunk = items[a:a + gen.settings.batch_size]
        prompts = [prompt.replace("<TOKEN>", token_names[c]) for c, _ in chunk]
        seeds = [derive_seed(seed, shift, c, k) for c, k in chunk]
        jpegs = gen.generate(prompts, seeds)
        images = [Image.open(io.BytesIO(b)).convert("RGB") for b in jpegs]
        sc = clip_scores(clip, images, [imagenet.get_class(c).name for c, _ in chunk], [prompt] * len(chunk))
        for j, ((c, k), data) in enumerate(zip(chunk, jpegs)):
            shift_score = float(sc["shift_score"][j])
            yield {"image": {"bytes": data, "path": None}, "label": c,
                   "image_id": f"{shift}/{imagenet.wnids()[c]}/{k:02d}", "config": shift, "keep": True,
                   "pair_id": None, "shift": shift, "prompt": prompts[j], "class_token": token_names[c],
                   "seed": seeds[j], "sample": k, **fixed, "clip_class_score": float(sc["class_score"][j]),
                   "clip_shift_score": None if math.isnan(shift_score) else shift_score,
                   "clip_image_embedding": sc["embedding"][j].tolist()}
        bar.update(len(chunk))
    record_batch_size(gen.backoff.batch_size)


@threaded
def run(cfg: Config) -> int:
    from tqdm.auto import tqdm

    from genshift.builders.textual_inversion import token_name, tokens_digest
    from genshift.data_cards import render_card
    from genshift.suite_format import SuiteWriter

    shifts = shift_table(cfg)
    classes = parse_classes(cfg.classes) if cfg.classes or not cfg.smoke else list(SMOKE_CLASSES)
    samples = 2 if cfg.smoke and cfg.samples_per_class == 50 else cfg.samples_per_class
    settings = generation_settings(cfg)
    fractions = kept_fractions(cfg, shifts)
    proc = current_process()
    device = proc.device(cfg.device, cpu=cfg.smoke)
    out = Path(cfg.out)
    n_shards = cfg.num_shards or max(1, math.ceil(len(classes) * samples / cfg.images_per_shard))
    plans = {s: plan_nonempty_shards(classes, n_shards, key=lambda c, s=s: f"{s}/{c}") for s in shifts}
    token_kind, token_path, tokens = token_source(cfg, classes)
    fingerprint = {"shifts": shifts, "classes": classes, "samples": samples, "seed": cfg.seed,
                   "shards": {s: len(p) for s, p in plans.items()}, "generation": asdict(settings),
                   "tokens": token_kind, "tokens_sha256": tokens_digest(token_path) if tokens else None,
                   "ti": [cfg.ti_steps, cfg.ti_lr] if token_kind == "trained" else None, "smoke": cfg.smoke,
                   "clip": None if cfg.smoke else [cfg.clip_model, cfg.clip_pretrained],
                   "cpu_threads": cfg.cpu_threads, "keep_rule": cfg.keep_rule,
                   "shift_gate_quantile": cfg.shift_gate_quantile if cfg.keep_rule == "class+shift" else None,
                   "kept_fractions": fractions}
    features = common.features(shift="string", prompt="string", class_token="string", seed="int64", sample="int32",
                               generator="string", generator_revision="string", scheduler="string", steps="int32",
                               guidance="float32", clip_class_score="float32", clip_shift_score="float32",
                               clip_image_embedding="float32[]")
    writer_kw = dict(suite_id=SUITE_ID, extra_features=features, fingerprint=fingerprint)
    if cfg.tokens_only:
        _load_models(cfg, settings, classes, device, token_kind, token_path, tokens)
        if proc.is_main:
            print(f"tokens: {out / 'tokens.zip'}")
        return 0
    final = common.open_writer(cfg, proc, **writer_kw)
    if final is None:
        return 0
    stage = SuiteWriter(out / STAGE, clean_incomplete=proc.is_main, **writer_kw)
    proc.wait()  # nobody writes before the main process has cleaned up stale temporary files

    work = [(shift, i, shard) for shift in shifts for i, shard in enumerate(plans[shift])]
    mine = [w for w in proc.my_shards(work) if not stage.shard_done(w[0], w[1], len(plans[w[0]]))]
    if not (mine or proc.is_main or token_kind == "trained"):  # (every process trains its share of the tokens)
        return 0  # nothing left for this process
    gen, clip, token_info = _load_models(cfg, settings, classes, device, token_kind, token_path, tokens)
    token_names = {c: (imagenet.get_class(c).name if token_kind == "none" else token_name(c)) for c in classes}
    with tqdm(total=sum(len(shard) * samples for _, _, shard in mine), desc=f"generate [{proc.index}/{proc.count}]",
              unit="img", disable=not cfg.progress, dynamic_ncols=True) as bar:
        for shift, i, shard in mine:
            rows = _shard_rows([(c, k) for c in shard for k in range(samples)], shift, shifts[shift], gen, clip,
                               cfg.seed, token_names, bar, partial(common.record_batch_size, out / STAGE, proc.index))
            stage.write_shard(shift, i, len(plans[shift]), rows)
    if not proc.is_main:
        return 0
    if proc.count > 1:
        common.wait_for(lambda: [f"{s} #{i}" for s, i, _ in work if not stage.shard_done(s, i, len(plans[s]))],
                        "generated shard(s)", cfg.wait_timeout)
    p = {"builder": "genshift.builders.imagenet_star", "paper": "Vendrow et al., Dataset Interfaces (2023)",
         "generation": {**gen.provenance(), "batch_size_effective": common.effective_batch_sizes(out / STAGE)},
         "determinism": common.provenance(cfg.cpu_threads, device),
         "clip_filter": {"model": clip.model_id, "rule": cfg.keep_rule},
         "seed": cfg.seed, "seed_rule": "derive_seed(seed, shift, class, sample) = sha256 -> 63 bits",
         "samples_per_class": samples, "classes": len(classes), "shifts": shifts, **token_info,
         "library_versions": common.versions("torch", "diffusers", "transformers", "open_clip_torch", "datasets",
                                             "pillow", "genshift-bench")}
    p["clip_filter"].update(_filter_phase(out, final, {s: len(v) for s, v in plans.items()}, fractions, cfg.keep_rule,
                                          cfg.shift_gate_quantile))
    manifest = final.finalize(generator=p, card=lambda m: render_card(
        m, template="imagenet_star", license="mit", pretty_name="ImageNet* (genshift-bench rebuild)",
        tags=["imagenet-star", "dataset-interfaces", "synthetic"], context={"p": p}))
    shutil.rmtree(out / STAGE, ignore_errors=True)
    shutil.rmtree(out / TOKENS_WORK, ignore_errors=True)
    kept = {c: f"{v.kept}/{v.rows}" for c, v in manifest.configs.items()}
    print(f"built {out}: {sum(v.rows for v in manifest.configs.values())} images; kept {kept}; "
          f"manifest sha256 {manifest.sha256}")
    return 0


def _filter_phase(out: Path, final, n_shards: dict[str, int], fractions, rule: str, gate_quantile: float) -> dict:
    """Calibrate per-shift thresholds on all staged scores, then write the final shards with keep."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from genshift.suite_format import shard_name

    def source(shift, i, n) -> Path:  # the staged shard, or the final one a previous filter phase wrote
        staged = out / STAGE / shard_name(shift, i, n)
        return staged if staged.is_file() else final.root / shard_name(shift, i, n)

    def with_keep(staged: Path, th):  # a staged shard's rows with keep set, 100 rows at a time
        for batch in pq.ParquetFile(staged).iter_batches(batch_size=100):
            keep = keep_flags(batch.column("clip_class_score").to_numpy(zero_copy_only=False),
                              batch.column("clip_shift_score").to_numpy(zero_copy_only=False).astype(float), th)
            for row, k in zip(batch.to_pylist(), keep):
                yield {**row, "keep": bool(k)}

    missing = [shard_name(s, i, n) for s, n in n_shards.items() for i in range(n)
               if not (out / STAGE / shard_name(s, i, n)).is_file() and not final.shard_done(s, i, n)]
    if missing:
        raise BenchError(f"{len(missing)} generated shard(s) are missing (e.g. {missing[0]}); rerun the build")
    cls_scores, shift_scores = {}, {}
    for shift, n in n_shards.items():
        t = pa.concat_tables(pq.read_table(source(shift, i, n), columns=["clip_class_score", "clip_shift_score"])
                             for i in range(n))
        cls_scores[shift], shift_scores[shift] = t["clip_class_score"].to_numpy(), t["clip_shift_score"].to_numpy()
    thresholds = calibrate(cls_scores, fractions, rule=rule, shift_scores=shift_scores, shift_quantile=gate_quantile)
    for shift, n in n_shards.items():
        for i in range(n):
            if not final.shard_done(shift, i, n):
                final.write_shard(shift, i, n, with_keep(out / STAGE / shard_name(shift, i, n), thresholds[shift]))

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
