"""The ImageNet* CLIP quality filter (Vendrow et al. 2023; ``docs/builders.md``): class and shift presence scores
(cosine of normalised open_clip embeddings, no logit scale), and a ``keep`` rule :func:`calibrate`d to the kept
fraction per shift of the authors' released masks (their rule is unknown). Thresholds are recorded unrounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from genshift.errors import BenchError


@lru_cache(maxsize=1)
def released_kept_counts() -> tuple[int, dict[str, int]]:
    """(images per shift, {shift: kept}) of the authors' released masks (package data)."""
    import yaml

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
