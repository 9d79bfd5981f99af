r"""Metrics: pure functions of per-image predictions (numpy arrays in, numbers out; no I/O).

Direction, label and unit of each metric are declared once in ``genshift.families``; ``delta_acc_at_k``
is signed (negative = drop). Accuracies are fractions in [0, 1]; empty input gives ``nan`` (stored as
``null``). Inputs: ``y_true`` (n,) ImageNet-1k indices, ``topk`` (n, K) predicted class indices sorted
by decreasing probability (K >= the k asked for).
"""

from __future__ import annotations

import numpy as np

from genshift import imagenet


def _check(y_true: np.ndarray, topk: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    y_true = np.asarray(y_true)
    topk = np.asarray(topk)
    if topk.ndim != 2 or y_true.shape != (topk.shape[0],):
        raise ValueError(f"topk must be (n, K) and y_true (n,), got {topk.shape} and {y_true.shape}")
    if not 1 <= k <= topk.shape[1]:
        raise ValueError(f"k={k} needs at least k stored predictions per image, have {topk.shape[1]}")
    return y_true, topk


def hits_at_k(y_true, topk, *, k: int = 1) -> np.ndarray:
    """Per-image indicator that the true class is among the first ``k`` predictions, (n,) bool."""
    y_true, topk = _check(y_true, topk, k)
    return (topk[:, :k] == y_true[:, None]).any(axis=1)


def acc_at_k(y_true, topk, *, k: int = 1) -> float:
    r"""Top-k accuracy (LANCE Eq. 3's :math:`\mathrm{acc}@k`; ImageNet* shift accuracy at k=1).

    .. math:: \mathrm{acc}@k = \frac{1}{n}\sum_i \mathbb{1}[y_i \in \hat{Y}^{(k)}_i]

    >>> acc_at_k([1, 2, 3], [[1, 0], [0, 2], [0, 1]], k=1)
    0.3333333333333333
    >>> acc_at_k([1, 2, 3], [[1, 0], [0, 2], [0, 1]], k=2)
    0.6666666666666666
    """
    hits = hits_at_k(y_true, topk, k=k)
    return float(hits.mean()) if hits.size else float("nan")


def absolute_impact(acc_reference: float, acc_shift: float) -> float:
    r"""Absolute impact of a shift (Dataset Interfaces): the drop in accuracy it causes.

    .. math:: \mathrm{impact}(s) = \mathrm{acc}(\mathrm{ref}) - \mathrm{acc}(s)

    with ref = ImageNet* ``base`` by default (same tokens and pipeline, only the prompt differs;
    the paper gives no formula, ``docs/results.md``), or a given in-distribution accuracy. Positive = the shift hurts.

    >>> round(absolute_impact(0.9, 0.75), 6)
    0.15
    """
    return float(acc_reference) - float(acc_shift)


def delta_acc_at_k(y_orig, topk_orig, y_cf, topk_cf, *, k: int = 1) -> float:
    r"""LANCE Eq. 3: accuracy on counterfactuals T' minus accuracy on originals T.

    .. math:: \Delta\mathrm{acc}@k = \frac{1}{|T'|}\sum_{(x',y)\in T'}\mathrm{acc}@k(M(x'),y)
              - \frac{1}{|T|}\sum_{(x,y)\in T}\mathrm{acc}@k(M(x),y)

    The two sets may differ in size (T' has one row per accepted edit). Negative = a drop.

    >>> delta_acc_at_k([0, 1], [[0], [1]], [0, 1, 1], [[0], [0], [1]], k=1)
    -0.33333333333333337
    """
    return acc_at_k(y_cf, topk_cf, k=k) - acc_at_k(y_orig, topk_orig, k=k)


def delta_p(p_orig, p_cf) -> np.ndarray:
    r"""LANCE sensitivity per pair: :math:`\Delta p(y_{GT}|x \to x') = |p(y_{GT}|x) - p(y_{GT}|x')|` (Fig. 2).

    ``p_orig`` and ``p_cf`` are the true-class probabilities of matched (original,
    counterfactual) rows. Always >= 0.

    >>> delta_p([0.9, 0.2], [0.3, 0.5]).round(6).tolist()
    [0.6, 0.3]
    """
    return np.abs(np.asarray(p_orig, dtype=np.float64) - np.asarray(p_cf, dtype=np.float64))


def paper_edit_type(edit_type: str | None) -> str | None:
    """LANCE's five edit types (Fig. 3, Table 3): a ``weather`` edit is a ``background`` edit.

    Older suites label weather edits separately; the paper reports them within background.

    >>> [paper_edit_type(t) for t in ("weather", "background", "domain", None)]
    ['background', 'background', 'domain', None]
    """
    return "background" if edit_type == "weather" else edit_type


def pair_up(orig_pair_ids, cf_pair_ids) -> np.ndarray:
    """For each counterfactual row, the index of its original row (same ``pair_id``); -1 if none.

    >>> pair_up(["a", "b"], ["b", "a", "c", "b"]).tolist()
    [1, 0, -1, 1]
    """
    index = {}
    for i, pid in enumerate(orig_pair_ids):
        if pid in index:
            raise ValueError(f"pair_id {pid!r} occurs twice among the originals")
        index[pid] = i
    return np.array([index.get(pid, -1) for pid in cf_pair_ids], dtype=np.int64)


def top1_error(y_true, topk) -> float:
    """IN-G: fraction of images whose top-1 prediction is not the true class.

    >>> top1_error([1, 2], [[1, 5, 6], [3, 2, 7]])
    0.5
    """
    return 1.0 - acc_at_k(y_true, topk, k=1)


def top3_failure_rate(y_true, topk) -> float:
    """IN-G transfer rate (Wiles et al. Fig. 4): true class not among the top-3 predictions.

    >>> top3_failure_rate([1, 2], [[1, 5, 6], [3, 4, 7]])
    0.5
    """
    return 1.0 - acc_at_k(y_true, topk, k=3)


def parent_failures(y_true, topk) -> np.ndarray:
    """Per-image IN-G failure (Wiles et al. s3; ``docs/results.md``), (n,) bool.

    fail(x, y) holds iff none of the top-3 predicted classes is under P(y), the WordNet parent
    of y used in the class prompt (the grandparent with the smallest offset); "under" uses the
    hypernym closure, so a Dungeness crab prediction for a crayfish is not a failure
    (both are under "crustacean").
    """
    y_true, topk = _check(y_true, topk, 3)
    member = imagenet.parent_membership()
    return ~member[y_true[:, None], topk[:, :3]].any(axis=1)


def parent_failure_rate(y_true, topk) -> float:
    """Fraction of images that fail by :func:`parent_failures`.

    >>> crayfish, dungeness, tench, goldfish, cock = 124, 118, 0, 1, 7
    >>> parent_failure_rate([crayfish, crayfish], [[dungeness, tench, goldfish], [tench, goldfish, cock]])
    0.5
    """
    f = parent_failures(y_true, topk)
    return float(f.mean()) if f.size else float("nan")


def probit(acc, *, eps: float = 1e-4) -> np.ndarray:
    r"""Probit transform :math:`\Phi^{-1}(a)` with accuracies clipped to ``[eps, 1-eps]``."""
    from scipy.stats import norm

    return norm.ppf(np.clip(np.asarray(acc, dtype=np.float64), eps, 1 - eps))


def id_ood_fit(id_acc, ood_acc, *, scale: str = "linear") -> dict:
    r"""ID/OOD line across models (Dataset Interfaces' "ID/OOD slope"; Taori et al.'s effective robustness).

    Least squares of OOD accuracy on ID accuracy over a population of models, either on raw
    accuracies (``scale="linear"``) or probit-transformed ones (``scale="probit"``):

    .. math:: g(y_m) = a\,g(x_m) + b + r_m, \qquad g = \mathrm{id}\ \text{or}\ \Phi^{-1}

    Returns slope :math:`a`, intercept :math:`b`, :math:`R^2`, and per model the effective
    robustness :math:`y_m - g^{-1}(a\,g(x_m) + b)` in accuracy units (positive = more robust
    than the line predicts). Needs at least 2 models with distinct ID accuracies, else ``nan``.

    >>> fit = id_ood_fit([0.5, 0.7, 0.9], [0.3, 0.5, 0.7])
    >>> round(fit["slope"], 6), round(fit["intercept"], 6), round(fit["r2"], 6)
    (1.0, -0.2, 1.0)
    """
    from scipy.stats import norm

    if scale not in ("linear", "probit"):
        raise ValueError(f"scale must be 'linear' or 'probit', got {scale!r}")
    x = np.asarray(id_acc, dtype=np.float64)
    y = np.asarray(ood_acc, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"id_acc and ood_acc differ in shape: {x.shape} vs {y.shape}")
    gx, gy = (x, y) if scale == "linear" else (probit(x), probit(y))
    nan = float("nan")
    if x.size < 2 or np.ptp(gx) == 0:
        return {"scale": scale, "slope": nan, "intercept": nan, "r2": nan, "n": int(x.size),
                "effective_robustness": [nan] * int(x.size)}
    slope, intercept = np.polyfit(gx, gy, 1)
    pred = slope * gx + intercept
    ss_res = float(((gy - pred) ** 2).sum())
    ss_tot = float(((gy - gy.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else nan
    pred_acc = pred if scale == "linear" else norm.cdf(pred)
    return {"scale": scale, "slope": float(slope), "intercept": float(intercept), "r2": float(r2),
            "n": int(x.size), "effective_robustness": (y - pred_acc).tolist()}
