r"""Seeded, paired bootstrap over images.

Every random draw is keyed by ``(seed, key)`` where ``key`` names the image set (usually the
suite config): two models scored on the same config get the **same** resampled images, so
differences between models have intervals too.

Two exact shortcuts keep this fast (re-scoring 1.2 M rows takes well under a second):

- The mean of a 0/1 outcome (accuracy, failure rate) under resampling n images with
  replacement has the distribution :math:`\mathrm{Binomial}(n, \hat p)/n` — identical to
  drawing the images, in O(B) instead of O(Bn) (:func:`binary_replicates`).
- Paired replicates for many models on one image set are ``W @ C / n`` with ``W`` the (B, n)
  resample counts shared by all models (:func:`paired_mean_replicates`, a matrix product), used
  by the leaderboard for rank intervals.

Continuous means over small sets (LANCE's Δp over <= a few thousand pairs) resample indices
directly (:func:`mean_replicates`). Intervals are percentile intervals.
"""

from __future__ import annotations

import hashlib

import numpy as np

DEFAULT_N_BOOT = 1000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95


def rng_for(seed: int, key: str) -> np.random.Generator:
    """A generator determined by ``(seed, key)`` only (never by model or call order)."""
    digest = hashlib.sha256(f"{int(seed)}|{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def binary_replicates(outcomes, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED, key: str) -> np.ndarray:
    """Bootstrap replicates of the mean of a 0/1 vector, shape ``(n_boot,)`` (exact shortcut)."""
    x = np.asarray(outcomes, dtype=bool)
    n = x.size
    if n == 0:
        return np.full(n_boot, np.nan)
    return rng_for(seed, key).binomial(n, x.mean(), size=n_boot) / n


def mean_replicates(values, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED, key: str) -> np.ndarray:
    """Bootstrap replicates of the mean of any vector by resampling indices, ``(n_boot,)``."""
    v = np.asarray(values, dtype=np.float64)
    n = v.size
    if n == 0:
        return np.full(n_boot, np.nan)
    idx = rng_for(seed, key).integers(0, n, size=(n_boot, n))
    return v[idx].mean(axis=1)


def _count_blocks(n: int, n_boot: int, rng: np.random.Generator, block: int = 64):
    """Yield ``(block, n)`` float32 resample-count matrices; the draws do not depend on ``block``."""
    for start in range(0, n_boot, block):
        rows = min(block, n_boot - start)
        counts = np.empty((rows, n), dtype=np.float32)
        for r in range(rows):
            counts[r] = np.bincount(rng.integers(0, n, size=n), minlength=n)
        yield counts


def paired_mean_replicates(values, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED,
                           key: str) -> np.ndarray:
    """Replicates of the per-column mean of ``values`` (n, M), the same resamples for every column.

    Returns ``(n_boot, M)``. Columns are models; rows of ``values`` are the images of the set
    named by ``key``, in a fixed order (sorted image ids). Adding or removing a model does not
    change the other models' replicates.
    """
    v = np.asarray(values, dtype=np.float32)
    if v.ndim == 1:
        v = v[:, None]
    n = v.shape[0]
    if n == 0:
        return np.full((n_boot, v.shape[1]), np.nan)
    rng = rng_for(seed, key)
    return np.concatenate([c @ v for c in _count_blocks(n, n_boot, rng)]) / n


def cluster_weights(n_clusters: int, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED,
                    key: str) -> np.ndarray:
    """``(n_boot, n_clusters)`` resample counts of whole clusters (e.g. LANCE source images).

    Used for statistics over related rows (an original and its counterfactuals move together).
    """
    if n_clusters == 0:
        return np.zeros((n_boot, 0), dtype=np.float32)
    return np.concatenate(list(_count_blocks(n_clusters, n_boot, rng_for(seed, key))))


def percentile_ci(replicates, *, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of bootstrap replicates; ``None`` if they are not finite."""
    r = np.asarray(replicates, dtype=np.float64)
    if r.size == 0 or not np.isfinite(r).all():
        return None
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(r, [alpha, 1 - alpha])
    return float(lo), float(hi)
