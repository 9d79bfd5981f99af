"""``bench discover``: open-ended failure search for one class (Wiles et al. s4.1).

1. Baseline: generate images from the class prompt alone; measure the model's failure rate
   (top-1 != class) or, with ``target``, the rate at which it predicts the target class.
2. Caption the baseline failures with the captioner forced to continue the class prompt (at most
   two sentences): these captions are hypotheses for what causes the failures.
3. Generate images from each hypothesis and measure the same rate.
4. Report each caption's rate, its ratio to the baseline, the counts, and a one-sided Fisher exact
   test (caption rate > baseline rate). Up to ``max_captions`` hypotheses are tested at once, so a
   hypothesis is called significant by its Benjamini-Hochberg q-value (false discovery rate
   ``alpha`` over the family), not its raw p-value; optionally refine the winning caption
   sentence by sentence (class prompt + one sentence at a time; a family of its own), as the
   paper refines its automatic captions.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from genshift.errors import BenchError
from genshift.builders.in_g_prompts import class_prompt, seed_caption
from genshift.builders.seeding import derive_seed

Generate = Callable[[list[str], list[int]], list[bytes]]
Classify = Callable[[list[bytes]], np.ndarray]
Caption = Callable[[list[bytes], str], list[str]]  # images, forced prefix -> texts


@dataclass(frozen=True)
class DiscoverConfig:
    n_baseline: int = 200
    n_per_caption: int = 100
    max_captions: int = 10
    batch_size: int = 8
    seed: int = 0
    refine: bool = True
    alpha: float = 0.05


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
          classify: Classify, cfg: DiscoverConfig, keep_failures: bool = False) -> tuple[int, list[bytes]]:
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
            classify: Classify, cfg: DiscoverConfig) -> list[Hypothesis]:
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
             cfg: DiscoverConfig = DiscoverConfig(), an: bool = False) -> dict:
    if cfg.n_baseline < 1 or cfg.n_per_caption < 1:
        raise BenchError("--n-baseline and --n-per-caption must be positive")
    prompt = class_prompt(label, an=an).text
    k0, failing = _rate(prompt, cfg.n_baseline, "baseline", label=label, target=target, generate=generate,
                        classify=classify, cfg=cfg, keep_failures=True)
    report = {"class": label, "class_prompt": prompt, "target": target,
              "rate": "target rate" if target is not None else "total failure rate (top-1 != class)",
              "baseline": {"failures": k0, "n": cfg.n_baseline, "rate": k0 / cfg.n_baseline},
              "config": asdict(cfg), "hypotheses": [], "refinement": []}
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


def captioner_fn(captioner) -> Caption:
    """Adapt ``genshift.builders.captioner.Captioner`` to the (images, prefix) -> texts signature."""
    from PIL import Image

    def caption(images: list[bytes], prefix: str) -> list[str]:
        out = []
        for a in range(0, len(images), 16):
            pil = [Image.open(io.BytesIO(b)) for b in images[a:a + 16]]
            out += captioner.caption(pil, prefix=prefix, num_beams=5, min_new_tokens=8, max_new_tokens=40)
        return out

    return caption


def format_report(report: dict) -> list[dict]:
    rows = []
    for h in report["hypotheses"] + report["refinement"]:
        rows.append({"caption": h["caption"][len(report["class_prompt"]):].strip() or "(class prompt)",
                     "failures": f"{h['failures']}/{h['n']}", "rate %": f"{100 * h['rate']:.1f}",
                     "ratio": "-" if h["ratio"] is None else f"{h['ratio']:.2f}", "p": f"{h['p_value']:.2g}",
                     "q (BH)": f"{h['q_value']:.2g}",
                     "significant": "yes" if h["significant"] else ""})
    return rows

