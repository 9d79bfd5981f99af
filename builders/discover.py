"""``bench discover``: open-ended failure search for one class (Wiles et al. s4.1; ``docs/builders.md``).
Captions of the failing images are hypotheses, each tested against the class prompt's failure rate (one-sided
Fisher exact test, Benjamini-Hochberg over the family tested together); the winner is refined sentence by sentence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from genshift import imagenet
from genshift.builders.common import Checked, ConfigError, option
from genshift.builders.in_g import CAPTIONING, Classify, Generate, captioner_fn, class_prompt, seed_caption, shots
from genshift.builders.seeding import derive_seed

Caption = Callable[[list[bytes], str], list[str]]  # images, forced prefix -> texts


@dataclass(frozen=True)
class Config(Checked):
    """The options of ``bench discover`` (the search's settings and the models it runs)."""

    model: str | None = option(None, "timm model to probe", required=True)
    checkpoint: str | None = option(None, "local weights for --model")
    klass: str | None = option(None, "class index or wnid", flag="--class", required=True)
    target: str | None = option(None, "count predictions of this class (index or wnid) instead of any failure")
    n_baseline: int = option(200, "images generated from the class prompt", min=1)
    n_per_caption: int = option(100, "images generated per candidate caption", min=1)
    max_captions: int = option(10, "candidate captions tested at most", min=1)
    refine: bool = option(True, "skip refining the winning caption sentence by sentence", flag="--no-refine")
    alpha: float = 0.05  # false discovery rate of the Benjamini-Hochberg test
    generator: str = option("stabilityai/stable-diffusion-2-1-base", "Stable Diffusion checkpoint (Hub repo) that "
                                                                     "generates the images")
    captioner: str = option("Salesforce/blip2-opt-2.7b", "BLIP-2 checkpoint (Hub repo) that captions the failures")
    captioning: str = option("three-shot", "three-shot: the paper's few-shot prompt (the IN-G shots); single-image: "
                                           "the image and its class prompt only", choices=CAPTIONING)
    steps: int = option(50, "diffusion steps per image", min=1)
    size: int = option(512, "generated image size in pixels", min=8)
    batch_size: int = option(8, "images per generation batch", min=1)
    seed: int = option(0, "seed of the generation")
    device: str | None = option(None, "default: cuda when available")
    smoke: bool = option(False, "tiny random generator/captioner/model on CPU (plumbing check)")
    out: str | None = option(None, "write the JSON report here")


@dataclass
class Hypothesis:
    caption: str
    failures: int
    n: int
    rate: float
    ratio: float | None
    p_value: float
    q_value: float = float("nan")   # Benjamini-Hochberg over the family it was tested in
    significant: bool = False       # q_value < alpha


def _rate(prompt: str, n: int, key: str, *, label: int, target: int | None, generate: Generate,
          classify: Classify, cfg: Config, keep_failures: bool = False) -> tuple[int, list[bytes]]:
    hits, failing = 0, []
    for a in range(0, n, cfg.batch_size):
        m = min(cfg.batch_size, n - a)
        images = generate([prompt] * m, [derive_seed(cfg.seed, key, a + j) for j in range(m)])
        pred = np.asarray(classify(images)).argmax(1)
        fail = pred == target if target is not None else pred != label
        hits += int(fail.sum())
        if keep_failures:
            failing += [img for img, f in zip(images, fail) if f]
    return hits, failing


def _fisher(k: int, n: int, k0: int, n0: int) -> tuple[float | None, float]:
    """(rate ratio, one-sided Fisher exact p) for "k/n exceeds the baseline k0/n0"."""
    from scipy.stats import fisher_exact

    _, p = fisher_exact([[k, n - k], [k0, n0 - k0]], alternative="greater")
    base = k0 / n0 if n0 else 0.0
    return ((k / n) / base if base > 0 else None), float(p)


def bh_qvalues(p_values) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (step-up FDR; Benjamini & Hochberg 1995, s3).

    q_(i) = min over j >= i of m p_(j) / j, for the p-values sorted ascending, capped at 1.

    >>> [round(float(q), 4) for q in bh_qvalues([0.01, 0.04, 0.03, 0.2])]
    [0.04, 0.0533, 0.0533, 0.2]
    """
    from scipy.stats import false_discovery_control

    p = np.asarray(p_values, dtype=float)
    return false_discovery_control(p, method="bh") if p.size else p


def _family(label: int, texts: list[str], key: str, k0: int, *, target: int | None, generate: Generate,
            classify: Classify, cfg: Config) -> list[Hypothesis]:
    """Rates of ``texts``, each tested against the baseline; significance by BH over the family."""
    hyps = []
    for text in texts:
        k, _ = _rate(text, cfg.n_per_caption, f"{key}|{text}", label=label, target=target, generate=generate,
                     classify=classify, cfg=cfg)
        ratio, p = _fisher(k, cfg.n_per_caption, k0, cfg.n_baseline)
        hyps.append(Hypothesis(text, k, cfg.n_per_caption, k / cfg.n_per_caption, ratio, p))
    for h, q in zip(hyps, bh_qvalues([h.p_value for h in hyps])):
        h.q_value, h.significant = float(q), bool(q < cfg.alpha)
    return hyps


def discover(label: int, *, generate: Generate, classify: Classify, caption: Caption, target: int | None = None,
             cfg: Config = Config(), an: bool = False) -> dict:
    prompt = class_prompt(label, an=an).text
    k0, failing = _rate(prompt, cfg.n_baseline, "baseline", label=label, target=target, generate=generate,
                        classify=classify, cfg=cfg, keep_failures=True)
    report = {"class": label, "class_prompt": prompt, "target": target,
              "rate": "target rate" if target is not None else "total failure rate (top-1 != class)",
              "baseline": {"failures": k0, "n": cfg.n_baseline, "rate": k0 / cfg.n_baseline},
              "config": {k: getattr(cfg, k) for k in ("n_baseline", "n_per_caption", "max_captions", "batch_size",
                                                       "seed", "refine", "alpha", "captioning")},
              "hypotheses": [], "refinement": []}
    if not failing:
        report["note"] = "no baseline failure to caption; raise --n-baseline"
        return report
    captions = Counter(seed_caption(prompt, t) for t in caption(failing, prompt))
    kw = dict(target=target, generate=generate, classify=classify, cfg=cfg)
    hyps = _family(label, [t for t, _ in captions.most_common(cfg.max_captions)], "caption", k0, **kw)
    hyps.sort(key=lambda h: (h.p_value, -h.rate))
    report["hypotheses"] = [asdict(h) for h in hyps]
    best = hyps[0]
    if cfg.refine and best.significant:
        sentences = [s.strip() for s in best.caption[len(prompt):].split(".") if s.strip()]
        report["refinement"] = [asdict(h) for h in _family(label, [f"{prompt} {s}." for s in sentences], "refine",
                                                            k0, **kw)]
    return report


def search(cfg: Config) -> dict:
    """``bench discover``: load the models the config names and run :func:`discover`; the report."""
    from genshift.builders.captioner import Captioner
    from genshift.builders.in_g import classifier_from_timm
    from genshift.builders.sd_generate import GenerationSettings, SDGenerator

    for name in ("model", "klass"):
        if getattr(cfg, name) is None:
            raise ConfigError(name, "is required")
    label, target = imagenet.parse_class(cfg.klass), (imagenet.parse_class(cfg.target) if cfg.target else None)
    if cfg.smoke:
        settings = GenerationSettings(model_id="tiny", scheduler="default", steps=2, height=64, width=64,
                                      output_size=64, dtype="float32", batch_size=cfg.batch_size)
        gen, cap = SDGenerator.tiny(settings, prediction_type="epsilon"), Captioner.tiny()
        classify, _ = classifier_from_timm(cfg.model, checkpoint=cfg.checkpoint, pretrained=cfg.checkpoint is not None)
    else:
        import torch

        device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        settings = GenerationSettings(model_id=cfg.generator, scheduler="default", steps=cfg.steps, height=cfg.size,
                                      width=cfg.size, output_size=cfg.size, batch_size=cfg.batch_size)
        gen = SDGenerator.from_pretrained(settings, device=device)
        cap = Captioner.from_pretrained(cfg.captioner, device=device)
        classify, _ = classifier_from_timm(cfg.model, device=device, checkpoint=cfg.checkpoint)
    return discover(label, generate=gen.generate, classify=classify, target=target, cfg=cfg,
                    caption=captioner_fn(cap, shots()[0] if cfg.captioning == "three-shot" else []))
