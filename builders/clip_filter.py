"""The ImageNet* CLIP quality filter: scores stored per image, and a calibrated ``keep`` rule.

Scores (``specs/imagenet_star.md`` s5): open_clip ViT-H-14 (laion2b_s32b_b79k), cosine of
L2-normalised image and text embeddings, no logit scale:

- class presence: ``"a photo of a <class name>"``;
- shift presence (not for ``base``): the shift's prompt with the class replaced by "thing"
  ("a photo of a thing in the snow", "an oil painting of a thing", "a photo of a blue thing").

The authors' thresholds are unknown; what is known are the kept fractions per shift of the
released masks (spec s6). The documented rule here: **keep an image iff its class-presence score
is at least the shift's threshold**, and each shift's threshold is calibrated as the score quantile
that keeps the released fraction of that shift (``RELEASED_KEPT_FRACTION``). Base can only have
been filtered on class presence, and per-class kept counts correlate with class presence (spec
s5), hence class presence as the criterion. Shift-presence scores are stored for analyses and for
other rules (``--keep-rule``), and every threshold is recorded in the manifest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Kept fraction per shift in the authors' released masks.npy (specs/imagenet_star.md s6).
RELEASED_KEPT_FRACTION = {
    "base": 0.9263, "in_the_grass": 0.8028, "in_the_beach": 0.6285, "in_the_forest": 0.6732,
    "in_the_water": 0.6009, "on_the_road": 0.6449, "on_the_rocks": 0.7656, "in_the_snow": 0.7321,
    "in_the_rain": 0.4833, "in_the_fog": 0.5934, "in_bright_sunlight": 0.8993, "at_night": 0.6106,
    "studio_lighting": 0.6663, "blue": 0.5911, "green": 0.5126, "red": 0.5956, "yellow": 0.4327,
    "orange": 0.4099, "person_and_a": 0.2992, "and_a_flower": 0.6194, "oil_painting": 0.4675,
    "pencil_sketch": 0.4462, "embroidery": 0.2206, "at_dusk": 0.6190,
}
KEEP_RULES = ("class", "class+shift")


def class_caption(class_name: str) -> str:
    return f"a photo of a {class_name}"


def shift_caption(prompt: str) -> str | None:
    """The shift-presence caption of a shift prompt; ``None`` for the plain base prompt."""
    caption = prompt.replace("<TOKEN>", "thing")
    return None if caption == "a photo of a thing" else caption


def clip_scores(scorer, images, class_names: Sequence[str], prompts: Sequence[str]) -> dict[str, np.ndarray]:
    """Class and shift presence scores and image embeddings for a batch (PIL images)."""
    from builders.clip_scoring import cosine

    img = scorer.encode_images(images)
    cls = scorer.encode_texts([class_caption(n) for n in class_names])
    caps = [shift_caption(p) for p in prompts]
    shift = np.full(len(images), np.nan, dtype=np.float32)
    idx = [i for i, c in enumerate(caps) if c is not None]
    if idx:
        shift[idx] = cosine(img[idx], scorer.encode_texts([caps[i] for i in idx])).cpu().numpy()
    return {"class_score": cosine(img, cls).cpu().numpy().astype(np.float32), "shift_score": shift,
            "embedding": img.cpu().numpy().astype(np.float32)}


def calibrate_thresholds(scores: Mapping[str, np.ndarray], target: Mapping[str, float] = RELEASED_KEPT_FRACTION
                         ) -> dict[str, float]:
    """Per shift, the lowest threshold that keeps at most the target fraction of its images.

    With n scores and target fraction f, the threshold is the ``ceil(n * (1 - f))``-th smallest
    score (higher-is-better scores are kept when ``>= threshold``), so the kept count is
    ``n - ceil(n (1 - f))`` = ``floor(n f)`` when scores are distinct.
    """
    out = {}
    for shift, s in scores.items():
        s = np.sort(np.asarray(s, dtype=np.float64))
        if shift not in target:
            raise KeyError(f"no target kept fraction for shift {shift!r}; give one with --kept-fractions")
        if s.size == 0:
            out[shift] = float("inf")
            continue
        k = int(np.ceil(s.size * (1 - float(target[shift]))))
        out[shift] = float(s[k]) if k < s.size else float("inf")
    return out


def keep_flags(class_score: np.ndarray, shift_score: np.ndarray, threshold: float, *, rule: str = "class",
               shift_threshold: float | None = None) -> np.ndarray:
    """The keep rule applied to one shift's scores."""
    keep = np.asarray(class_score) >= threshold
    if rule == "class+shift" and shift_threshold is not None:
        s = np.asarray(shift_score)
        keep &= np.isnan(s) | (s >= shift_threshold)
    elif rule not in KEEP_RULES:
        raise ValueError(f"unknown keep rule {rule!r}; use one of {KEEP_RULES}")
    return keep
