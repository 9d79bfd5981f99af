r"""Failure directions (Jain et al., ICLR 2023): explain where a model fails, in words.

For each class, a linear SVM on CLIP image embeddings predicts whether the model got an image right;
its normal vector is the class's failure direction (Sec. 2), its cross-validated balanced accuracy the
direction's *strength* (Sec. 2.1), and the captions whose embedding difference to a reference caption
has the most negative / positive decision value name the hard / easy subpopulation (Sec. 2.2,
:math:`\hat c = (c - r)/\lVert c - r\rVert_2`). Fit as the authors' code does it, with guards it lacks:
``docs/reproducing.md``, "Failure directions".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np
import yaml

from genshift import imagenet

C_GRID = tuple(float(c) for c in np.logspace(-6, 0, 7))


@dataclass(frozen=True)
class DirectionOptions:
    c_grid: tuple[float, ...] = C_GRID
    cv: int = 2
    min_errors: int = 2
    min_correct: int = 2
    whiten: bool = True
    normalize: bool = True
    caption_whitening: bool = True   # the code's behaviour; False = the paper's formula
    reference_caption: str = "code"  # "code": 'a photo of a <class name>'; "paper": 'a photo of a <ancestor>'
    n_null: int = 10                 # permutation repeats for the null strength (0 = skip)
    k_images: int = 5
    k_captions: int = 10
    seed: int = 0


@dataclass
class Whitening:
    mean: np.ndarray
    std: np.ndarray
    whiten: bool = True
    normalize: bool = True

    @classmethod
    def fit(cls, reference: np.ndarray, *, whiten: bool = True, normalize: bool = True) -> Whitening:
        ref = np.asarray(reference, dtype=np.float64)
        mean = ref.mean(axis=0)
        std = (ref - mean).std(axis=0, ddof=1)
        return cls(mean, np.where(std > 0, std, 1.0), whiten, normalize)

    def __call__(self, e: np.ndarray) -> np.ndarray:
        z = np.asarray(e, dtype=np.float64)
        if self.whiten:
            z = (z - self.mean) / self.std
        if self.normalize:
            z = z / np.maximum(np.linalg.norm(z, axis=-1, keepdims=True), 1e-12)
        return z


def search_svm(z: np.ndarray, correct: np.ndarray, opts: DirectionOptions):
    """The C search of the authors' code; returns ``(strength, C, fitted SVC or None)``."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.svm import SVC

    best, best_c = -np.inf, None
    for c in opts.c_grid:
        svm = SVC(kernel="linear", C=c, class_weight="balanced")
        scores = cross_val_score(svm, z, correct, cv=StratifiedKFold(opts.cv, shuffle=False),
                                 scoring="balanced_accuracy")
        mean = float(np.mean(scores))
        if mean > best:  # strictly better: ties keep the smallest C
            best, best_c = mean, c
    if best_c is None:
        return float("nan"), None, None
    return best, best_c, SVC(kernel="linear", C=best_c, class_weight="balanced").fit(z, correct)


@lru_cache(maxsize=1)
def _caption_table() -> dict:
    text = resources.files("genshift").joinpath("_data", "failure_direction_captions.yaml").read_text()
    return yaml.safe_load(text)


def candidate_captions(label: int, *, reference: str = "code") -> tuple[str, list[str]]:
    """``(reference caption, candidate captions)`` for an ImageNet class. ``reference="code"`` (default): "a photo
    of a <class name>" (the authors' code); ``"paper"``: "a photo of a <ancestor>" (the appendix)."""
    if reference not in ("code", "paper"):
        raise ValueError(f"reference must be 'code' or 'paper', got {reference!r}")
    table = _caption_table()
    cls = imagenet.get_class(label)
    ancestor = cls.fd_ancestor or "entity"
    noun = ancestor.replace("_", " ")
    preps = table["common_prepositions"] + table["ancestor_prepositions"].get(ancestor, [])
    caps = [" ".join(p for p in ("a photo of a", adj, noun, prep) if p)
            for adj in table["adjectives"] for prep in preps]
    ref = f"a photo of a {cls.name}" if reference == "code" else f"a photo of a {noun}"
    return ref, [c for c in dict.fromkeys(caps) if c != ref]


@dataclass
class ClassDirection:
    label: int
    status: str
    n: int
    n_errors: int
    strength: float | None = None
    null_mean: float | None = None
    null_p95: float | None = None
    C: float | None = None
    hardest: list[str] = field(default_factory=list)
    easiest: list[str] = field(default_factory=list)
    hard_captions: list[tuple[str, float]] = field(default_factory=list)
    easy_captions: list[tuple[str, float]] = field(default_factory=list)
    proxy: dict | None = None


def class_direction(label: int, ids: Sequence[str], emb: np.ndarray, correct: np.ndarray, white: Whitening,
                    opts: DirectionOptions, *, encode_text: Callable[[list[str]], np.ndarray] | None = None
                    ) -> ClassDirection:
    """Fit one class's direction, rank its images and (with ``encode_text``) its captions."""
    order = np.argsort(np.asarray(ids))
    ids = [ids[i] for i in order]
    z = white(emb[order])
    y = np.asarray(correct, dtype=int)[order]
    n_err = int((y == 0).sum())
    out = ClassDirection(label=int(label), status="ok", n=int(y.size), n_errors=n_err)
    too_few = n_err < opts.min_errors or y.size - n_err < opts.min_correct
    strength, c, svm = (None, None, None) if too_few else search_svm(z, y, opts)
    if svm is None:
        out.status = "skipped"
        return out
    out.strength, out.C = strength, c
    if opts.n_null:
        rng = np.random.default_rng(opts.seed + int(label))
        null = [search_svm(z, rng.permutation(y), opts)[0] for _ in range(opts.n_null)]
        out.null_mean, out.null_p95 = float(np.nanmean(null)), float(np.nanquantile(null, 0.95))
    rank = np.argsort(svm.decision_function(z), kind="stable")
    out.hardest = [ids[i] for i in rank[: opts.k_images]]
    out.easiest = [ids[i] for i in rank[::-1][: opts.k_images]]
    if encode_text is not None:
        ref, caps = candidate_captions(label, reference=opts.reference_caption)
        t = encode_text([ref, *caps])
        diff = t[1:] - t[0]
        d = (white(diff) if opts.caption_whitening  # the code's pre-processing; else the paper's normalisation
             else diff / np.maximum(np.linalg.norm(diff, axis=-1, keepdims=True), 1e-12))
        values = svm.decision_function(d)
        srt = np.argsort(values, kind="stable")
        out.hard_captions = [(caps[i], float(values[i])) for i in srt[: opts.k_captions]]
        out.easy_captions = [(caps[i], float(values[i])) for i in srt[::-1][: opts.k_captions]]
        out.proxy = _proxy(emb[order], y, t[1 + srt[0]], t[1 + srt[-1]], k=max(1, y.size // 5))
    return out


def _proxy(emb: np.ndarray, correct: np.ndarray, hard_text: np.ndarray, easy_text: np.ndarray, *, k: int) -> dict:
    """Validation proxy (Fig. 7b): accuracy of the k images closest to the hard vs the easy caption."""
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)

    def acc_near(t):
        t = t / max(np.linalg.norm(t), 1e-12)
        return float(correct[np.argsort(-(e @ t), kind="stable")[:k]].mean())

    return {"k": int(k), "hard_caption_accuracy": acc_near(hard_text), "easy_caption_accuracy": acc_near(easy_text)}
