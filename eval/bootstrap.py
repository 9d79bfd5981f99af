r"""Seeded, paired bootstrap over images (Efron & Tibshirani 1993, ch. 6): :func:`resampling` draws from
``(seed, key, n, n_boot)`` only (``key``: the suite config; images in sorted ``image_id`` order), so every
model scored on a config gets the same resamples. Layout (rotated multinomial pools, sums by FFT):
``docs/results.md``, "Intervals".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

DEFAULT_N_BOOT = 1000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
MIN_STEP = 32          # rotations of one pool are at least this far apart
FFT_MIN_N = 2048       # below this the explicit count matrix is as fast
_FFT_COLUMNS = 32      # value columns transformed at once (bounds memory for many models)


def rng_for(seed: int, key: str) -> np.random.Generator:
    """A generator determined by ``(seed, key)`` only (never by model or call order)."""
    digest = hashlib.sha256(f"{int(seed)}|{key}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


@dataclass(frozen=True)
class Resampling:
    """``n_boot`` bootstrap resamples of ``n`` items in a fixed order (see the module docstring)."""

    n: int
    n_boot: int
    perm: np.ndarray      # (n,) position of each item in the pools' frame
    pools: np.ndarray     # (K, n) resample counts of K ordinary bootstrap draws
    offsets: np.ndarray   # (K,) rotation of each pool's first replicate
    per_pool: int         # R: replicates (rotations) per pool
    step: int             # distance between a pool's rotations

    def _shift(self, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, j = np.divmod(b, self.per_pool)
        return k, (self.offsets[k] + j * self.step) % self.n

    def matrix(self, rows: slice = slice(None)) -> np.ndarray:
        """The resample counts ``W`` (replicates x items), float32; ``rows`` selects replicates."""
        b = np.arange(self.n_boot)[rows]
        k, shift = self._shift(b)
        return self.pools[k[:, None], (self.perm[None, :] + shift[:, None]) % self.n].astype(np.float32)

    def sums(self, values) -> np.ndarray:
        """Replicate sums ``W @ values`` for ``values`` (n,) or (n, M): shape ``(n_boot, M)``."""
        v = np.column_stack([values])  # (n,) -> (n, 1)
        if v.shape[0] != self.n:
            raise ValueError(f"values have {v.shape[0]} rows, the resampling has {self.n} items")
        integer = v.dtype.kind in "biu"
        if self.n < FFT_MIN_N:
            # blocks of replicates bound the memory; integer sums are exact in any blocking, so theirs are larger
            rows = max(256, (1 << 22) // self.n) if integer else 256
            blocks = [self.matrix(slice(s, s + rows)).astype(np.float64) @ v.astype(np.float64)
                      for s in range(0, self.n_boot, rows)] or [np.zeros((0, v.shape[1]))]
            out = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        else:
            out = self._fft_sums(v.astype(np.float64))
        return np.rint(out, out=out) if integer else out

    def _fft_sums(self, v: np.ndarray) -> np.ndarray:
        # sum_i pool[(perm[i] + s) % n] v[i] = sum_m pool[(m + s) % n] g[m] with g[perm[i]] = v[i]: a circular
        # cross-correlation, evaluated at every shift s < n at once. FFTs are fast for 5-smooth lengths: use
        # L = n if n is one, else the pool repeated twice and zero-padded to a 5-smooth L >= 2n (no wrap-around
        # reaches the shifts s < n, so both give the same sums)
        from scipy import fft

        n = self.n
        pools = self.pools.astype(np.float64)
        length = n if fft.next_fast_len(n, real=True) == n else fft.next_fast_len(2 * n, real=True)
        if length != n:
            pools = np.tile(pools, 2)
        k, shift = self._shift(np.arange(self.n_boot))
        pool_f = fft.rfft(pools, n=length, axis=1)                                      # (K, L//2+1)
        out = np.empty((self.n_boot, v.shape[1]))
        for c in range(0, v.shape[1], _FFT_COLUMNS):
            g = np.zeros((min(_FFT_COLUMNS, v.shape[1] - c), n))  # one contiguous row per column: fast FFTs
            g[:, self.perm] = v[:, c:c + _FFT_COLUMNS].T
            g_f = np.conj(fft.rfft(g, n=length, axis=1))                               # (m, L//2+1)
            for pool in range(self.pools.shape[0]):
                sel = np.flatnonzero(k == pool)
                corr = fft.irfft(g_f * pool_f[pool][None, :], n=length, axis=1)         # (m, L)
                out[sel, c:c + g.shape[0]] = corr[:, shift[sel]].T
        return out


def resampling(n: int, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED, key: str) -> Resampling:
    """The resamples of the image set ``key`` with ``n`` items: a function of its arguments only."""
    n, n_boot = int(n), int(n_boot)
    rng = rng_for(seed, key)
    if n == 0:
        return Resampling(0, n_boot, np.zeros(0, np.int64), np.zeros((0, 0), np.int32), np.zeros(0, np.int64), 1, 1)
    per_pool = max(1, min(n_boot, n // MIN_STEP))
    n_pools = -(-n_boot // per_pool)
    perm = rng.permutation(n)
    draws = rng.integers(0, n, size=(n_pools, n))
    pools = np.bincount((draws + n * np.arange(n_pools)[:, None]).ravel(), minlength=n_pools * n)
    offsets = rng.integers(0, n, size=n_pools)
    return Resampling(n, n_boot, perm, pools.reshape(n_pools, n).astype(np.int32), offsets, per_pool,
                      n // per_pool)


def paired_mean_replicates(values, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED,
                           key: str) -> np.ndarray:
    """Replicates ``(n_boot, M)`` of the per-column mean of ``values`` (n,) or (n, M) (columns: models or outcomes;
    rows: the images of ``key`` in sorted image-id order) over the resamples of ``key``. A column's replicates do
    not depend on the other columns: a model scored alone or with 500 others gets identical replicates."""
    v = np.column_stack([values])  # (n,) -> (n, 1)
    n = v.shape[0]
    if n == 0:
        return np.full((n_boot, v.shape[1]), np.nan)
    return resampling(n, n_boot=n_boot, seed=seed, key=key).sums(v) / n


def cluster_weights(n_clusters: int, *, n_boot: int = DEFAULT_N_BOOT, seed: int = DEFAULT_SEED,
                    key: str) -> np.ndarray:
    """``(n_boot, n_clusters)`` resample counts of whole clusters (e.g. LANCE source images: an original and its
    counterfactuals move together)."""
    if n_clusters == 0:
        return np.zeros((n_boot, 0), dtype=np.float32)
    return resampling(n_clusters, n_boot=n_boot, seed=seed, key=key).matrix()


def percentile_ci(replicates, *, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float] | None:
    """Percentile interval of bootstrap replicates; ``None`` if they are not finite."""
    r = np.asarray(replicates, dtype=np.float64)
    if r.size == 0 or not np.isfinite(r).all():
        return None
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(r, [alpha, 1 - alpha])
    return float(lo), float(hi)
