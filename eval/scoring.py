"""From predictions tables to the metrics of each suite family, with bootstrap intervals: ``score`` is a pure
function (``bench eval`` and ``bench verify`` must give identical numbers). Every metric value is
``{"value": float | None, "ci": [lo, hi] | None, "n": int}`` (fractions, ``None`` when undefined).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from genshift import imagenet
from genshift.eval import bootstrap, metrics
from genshift.eval.predictions import topk_matrix
from genshift.families import get_family

LANCE_HEADLINE_T = "originals_with_counterfactual"  # Table 2's numbers are fractions of N = 576 (Prabhu et al.)


@dataclass(frozen=True)
class ScoringOptions:
    """Metric switches; all are recorded in the result and covered by its config hash."""

    filter: bool = True                       # score rows with keep == True only
    reference_config: str | None = None       # ImageNet*: the in-distribution config (default: base)
    reference_accuracy: float | None = None   # ImageNet*: impact against this ID accuracy instead
    n_boot: int = bootstrap.DEFAULT_N_BOOT
    seed: int = bootstrap.DEFAULT_SEED
    confidence: float = bootstrap.DEFAULT_CONFIDENCE
    fold_weather: bool = True                 # LANCE: edit_type "weather" counts as "background" (Fig. 3's 5 types)

    def to_dict(self) -> dict:
        return asdict(self)


def _metric(value: float, replicates, n: int, confidence: float) -> dict:
    v = None if value is None or not np.isfinite(value) else float(value)
    ci = bootstrap.percentile_ci(replicates, confidence=confidence) if v is not None else None
    return {"value": v, "ci": list(ci) if ci else None, "n": int(n)}


@dataclass
class _Config:
    """Arrays of one config's scored rows, sorted by image_id (the bootstrap order)."""

    name: str
    labels: np.ndarray
    topk: np.ndarray
    true_prob: np.ndarray
    true_rank: np.ndarray
    pair_id: list
    edit_type: list | None
    edit_type_fine: list | None
    n_total: int
    n_kept: int

    @classmethod
    def from_table(cls, name: str, table: pa.Table, *, filter: bool) -> _Config:
        keep = table["keep"].to_numpy(zero_copy_only=False).astype(bool)
        rows = np.flatnonzero(keep) if filter else np.arange(table.num_rows)
        t = table.take(rows)
        return cls(
            name=name, labels=t["label"].to_numpy().astype(np.int64), topk=topk_matrix(t).astype(np.int64),
            true_prob=t["true_prob"].to_numpy().astype(np.float64), true_rank=t["true_rank"].to_numpy(),
            pair_id=t["pair_id"].to_pylist(),
            edit_type=t["edit_type"].to_pylist() if "edit_type" in t.column_names else None,
            edit_type_fine=t["edit_type_fine"].to_pylist() if "edit_type_fine" in t.column_names else None,
            n_total=table.num_rows, n_kept=int(keep.sum()),
        )

    @property
    def n(self) -> int:
        return int(self.labels.size)

    def hits(self, k: int) -> np.ndarray:
        return self.true_rank < k  # exact for every k (true_rank: position in the top-k's order)


def score(family: str, tables: dict[str, pa.Table], options: ScoringOptions) -> dict:
    """All metrics of a metric family (``genshift.families``) from predictions tables by config.

    Every config gets acc@1/acc@5 (and the family's extra per-image outcomes) with paired bootstrap
    intervals; the family's scorer then adds its block (``metrics[<family block>]``)."""
    fam = get_family(family)
    extra = fam.resolve(fam.outcomes)
    cfgs = {name: _Config.from_table(name, t, filter=options.filter) for name, t in sorted(tables.items())}
    out: dict = {"configs": {}}
    reps: dict[str, np.ndarray] = {}
    for name, c in cfgs.items():
        entry = {"n_total": c.n_total, "n_kept": c.n_kept, "n_scored": c.n}
        outcomes = {f"acc{k}": c.hits(k) for k in (1, 5)}
        if extra is not None:
            outcomes.update(extra(c))
        reps.update({f"{name}/{m}": r for m, r in outcome_replicates(name, outcomes, options).items()})
        for k in (1, 5):
            entry[f"acc{k}"] = _metric(outcomes[f"acc{k}"].mean() if c.n else np.nan, reps[f"{name}/acc{k}"], c.n,
                                       options.confidence)
        out["configs"][name] = entry
    if fam.scorer is not None:
        out[fam.block] = fam.resolve(fam.scorer)(cfgs, reps, options)
    return out


def outcome_replicates(config: str, outcomes: dict[str, np.ndarray], o: ScoringOptions) -> dict[str, np.ndarray]:
    """Bootstrap replicates ``(n_boot,)`` of the mean of each per-image outcome of one config, all on the
    config's resamples (``genshift.eval.bootstrap``), so intervals of different models are paired."""
    names = list(outcomes)
    if not names:
        return {}
    r = bootstrap.paired_mean_replicates(np.stack([outcomes[m] for m in names], axis=1), n_boot=o.n_boot,
                                         seed=o.seed, key=config)
    return {m: r[:, i] for i, m in enumerate(names)}


def imagenet_star_block(cfgs: dict[str, _Config], reps: dict, o: ScoringOptions) -> dict:
    """ImageNet*: each shift's absolute impact against the reference and their mean for this model."""
    ref = o.reference_config or "base"
    shifts = [c for c in cfgs if c != ref]
    if o.reference_accuracy is not None:
        ref_value, ref_desc = float(o.reference_accuracy), f"given accuracy {o.reference_accuracy}"
        ref_reps = np.full(o.n_boot, ref_value)
    elif ref in cfgs:
        ref_value = cfgs[ref].hits(1).mean() if cfgs[ref].n else np.nan
        ref_reps, ref_desc = reps[f"{ref}/acc1"], f"config {ref}"
    else:
        return {"reference": None, "note": f"reference config {ref!r} was not evaluated; absolute impact undefined",
                "absolute_impact": {}, "model_mean_impact": _metric(np.nan, None, 0, o.confidence)}
    impact, impact_reps = {}, []
    for s in shifts:
        c = cfgs[s]
        acc = c.hits(1).mean() if c.n else np.nan
        r = ref_reps - reps[f"{s}/acc1"]
        impact[s] = _metric(metrics.absolute_impact(ref_value, acc), r, c.n, o.confidence)
        if c.n:
            impact_reps.append(r)
    values = [v["value"] for v in impact.values() if v["value"] is not None]
    mean_reps = np.mean(impact_reps, axis=0) if impact_reps else None
    return {
        "reference": ref_desc,
        "absolute_impact": impact,
        # this model's impact averaged over its shifts; a shift's impact averaged over models
        # (the paper's "absolute impact" of a shift) is genshift.eval.slope.shift_impact, across results
        "model_mean_impact": _metric(np.mean(values) if values else np.nan, mean_reps, len(values), o.confidence),
    }


def lance_block(cfgs: dict[str, _Config], reps: dict, o: ScoringOptions) -> dict:
    """LANCE Table 2 (acc@k on originals T, reconstructions of T and counterfactuals T', with Δ vs T)
    and Fig. 3 (mean Δp per edit type), all with one cluster bootstrap over source images."""
    orig, cf, rec = cfgs.get("original"), cfgs.get("counterfactual"), cfgs.get("reconstruction")
    out: dict = {"headline_T": LANCE_HEADLINE_T}
    if orig is None or cf is None:
        out["note"] = "needs configs 'original' and 'counterfactual'"
        return out
    match = _match_originals(orig, cf)
    with_cf = np.zeros(orig.n, dtype=bool)
    with_cf[match] = True
    w = lance_pair_weights(orig.n, o)
    rec_match = _match_originals(orig, rec) if rec is not None else None
    for k in (1, 5):
        out[f"delta_acc{k}"] = {}
        for t_name, mask in (("all_originals", np.ones(orig.n, dtype=bool)),
                             ("originals_with_counterfactual", with_cf)):
            d = delta_acc_replicates(orig.hits(k)[:, None], cf.hits(k)[:, None], match, mask, w)
            out[f"delta_acc{k}"][t_name] = _metric(d.delta[0], d.delta_reps[:, 0], cf.n, o.confidence)
            out.setdefault(f"acc{k}_T", {})[t_name] = _metric(d.acc_t[0], d.acc_t_reps[:, 0], int(mask.sum()),
                                                               o.confidence)
            if rec_match is not None:  # Table 2's "Reconstructed" row: the reconstructions of the same T
                in_t = mask[rec_match]
                r = delta_acc_replicates(orig.hits(k)[:, None], rec.hits(k)[in_t][:, None], rec_match[in_t], mask, w)
                out.setdefault(f"acc{k}_reconstruction", {})[t_name] = _metric(
                    r.acc_t[0] + r.delta[0], r.acc_t_reps[:, 0] + r.delta_reps[:, 0], int(in_t.sum()), o.confidence)
                out.setdefault(f"delta_acc{k}_reconstruction", {})[t_name] = _metric(
                    r.delta[0], r.delta_reps[:, 0], int(in_t.sum()), o.confidence)
        # T' (every counterfactual) does not depend on the choice of T
        out[f"acc{k}_counterfactual"] = _metric(d.acc_t[0] + d.delta[0], d.acc_t_reps[:, 0] + d.delta_reps[:, 0], cf.n,
                                                o.confidence)
    if rec is None:
        out["note"] = "no 'reconstruction' config scored: Table 2's Reconstructed row is not computed"
    dp = metrics.delta_p(orig.true_prob[match], cf.true_prob)
    out["delta_p"] = _cluster_mean(dp, match, np.ones(dp.size, dtype=bool), w, o)
    types = cf.edit_type
    if types is not None and o.fold_weather:
        types = [metrics.paper_edit_type(t) for t in types]
    out["delta_p_by_edit_type"] = _grouped_cluster_mean(dp, types, match, w, o)
    if cf.edit_type_fine is not None:
        out["delta_p_by_edit_type_fine"] = _grouped_cluster_mean(dp, cf.edit_type_fine, match, w, o)
    wnids = [imagenet.wnids()[y] for y in cf.labels]
    out["delta_p_by_class"] = _grouped_cluster_mean(dp, wnids, match, w, o)
    out["n_pairs"] = int(dp.size)
    out["n_originals_with_counterfactual"] = int(with_cf.sum())
    return out


def _match_originals(orig: _Config, other: _Config) -> np.ndarray:
    match = metrics.pair_up(orig.pair_id, other.pair_id)
    if (match < 0).any():
        bad = other.pair_id[int(np.flatnonzero(match < 0)[0])]
        raise ValueError(f"{other.name} with pair_id {bad!r} has no original among the scored rows")
    return match


def _cluster_mean(values: np.ndarray, match: np.ndarray, sel: np.ndarray, w: np.ndarray, o: ScoringOptions) -> dict:
    """Mean of per-pair ``values[sel]``; replicates weight each pair by its source image's resample count."""
    v, m = values[sel], match[sel]
    n_o = w.shape[1]
    total = np.bincount(m, weights=v, minlength=n_o)
    count = np.bincount(m, minlength=n_o).astype(np.float64)
    reps = (w @ total) / np.maximum(w @ count, 1)
    reps[(w @ count) == 0] = np.nan  # a resample without any such pair has no mean
    if v.size and np.isnan(reps).any():
        reps = reps[~np.isnan(reps)]
    return _metric(v.mean() if v.size else np.nan, reps, v.size, o.confidence)


def _grouped_cluster_mean(values: np.ndarray, groups: list | None, match: np.ndarray, w: np.ndarray,
                          o: ScoringOptions) -> dict:
    if groups is None:
        return {}
    g = np.asarray(["" if x is None else str(x) for x in groups])
    return {name or "(none)": _cluster_mean(values, match, g == name, w, o) for name in sorted(set(g.tolist()))}


def lance_pair_weights(n_originals: int, o: ScoringOptions) -> np.ndarray:
    """Cluster-bootstrap counts over source images: an original and its counterfactuals move together."""
    return bootstrap.cluster_weights(n_originals, n_boot=o.n_boot, seed=o.seed, key="lance/pairs")


@dataclass(frozen=True)
class DeltaAcc:
    delta: np.ndarray        # (M,) acc(T') - acc(T)
    delta_reps: np.ndarray   # (B, M)
    acc_t: np.ndarray        # (M,) acc on the originals T
    acc_t_reps: np.ndarray   # (B, M)


def delta_acc_replicates(hits_orig, hits_cf, match, mask, w) -> DeltaAcc:
    """LANCE Δacc@k (Eq. 3: mean acc@k over the counterfactuals T' minus over the originals T) for M
    models at once, with cluster-bootstrap replicates shared by all models.

    ``hits_orig`` (n_o, M) and ``hits_cf`` (n_c, M) are per-image hits; ``match`` (n_c,) the index of
    each counterfactual's original; ``mask`` (n_o,) selects T; ``w`` (B, n_o) resample counts of
    source images. A replicate's accuracy on T' weights each counterfactual by its pair's count.
    Hand-computed below: T' = 1/4, T = 2/3, Δ = -5/12; with counts (2, 0, 1) T' = 2/5, T = 2/3,
    Δ = -4/15.

    >>> h_o = np.array([[1], [1], [0]]); h_c = np.array([[0], [1], [0], [0]]); m = np.array([0, 0, 1, 2])
    >>> d = delta_acc_replicates(h_o, h_c, m, np.ones(3, bool), np.array([[1., 1., 1.], [2., 0., 1.]]))
    >>> [round(float(x), 4) for x in (d.delta[0], d.delta_reps[0, 0], d.delta_reps[1, 0])]
    [-0.4167, -0.4167, -0.2667]
    """
    h_o = np.asarray(hits_orig, dtype=np.float64)
    h_c = np.asarray(hits_cf, dtype=np.float64)
    n_o = h_o.shape[0]
    cf_per_pair = np.bincount(match, minlength=n_o).astype(np.float64)
    hits_c_per_pair = np.zeros((n_o, h_c.shape[1]))
    np.add.at(hits_c_per_pair, match, h_c)
    acc_c = h_c.mean(axis=0) if h_c.shape[0] else np.full(h_c.shape[1], np.nan)
    rep_c = (w @ hits_c_per_pair) / np.maximum(w @ cf_per_pair, 1)[:, None]
    acc_o = h_o[mask].mean(axis=0) if mask.any() else np.full(h_o.shape[1], np.nan)
    rep_o = (w[:, mask] @ h_o[mask]) / np.maximum(w[:, mask].sum(1), 1)[:, None]
    return DeltaAcc(acc_c - acc_o, rep_c - rep_o, acc_o, rep_o)


def in_g_outcomes(c: _Config) -> dict[str, np.ndarray]:
    """IN-G's per-image failures: top-1 error, top-3 failure (Wiles et al. Fig. 4), WordNet-parent failure."""
    return {"top1_error": ~c.hits(1), "top3_failure_rate": ~c.hits(3),
            "parent_failure_rate": metrics.parent_failures(c.labels, c.topk) if c.n else np.zeros(0, bool)}


def in_g_block(cfgs: dict[str, _Config], reps: dict, o: ScoringOptions) -> dict:
    """IN-G: the failure rates of every config, with the intervals of their per-image outcomes."""
    out = {}
    for name, c in cfgs.items():
        out[name] = {m: _metric(v.mean() if v.size else np.nan, reps[f"{name}/{m}"], v.size, o.confidence)
                     for m, v in in_g_outcomes(c).items()}
    return out
