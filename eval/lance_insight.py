"""LANCE's class-level insight (paper Sec. 4.2, Fig. 6): K-means clusters of edits (the CLIP text direction
edit words - replaced words, ``edit_text_direction``) ranked by the model's mean Δp over their pairs, with
example pairs. An analysis of a result (stored under ``analysis``), not a benchmark metric.
"""

from __future__ import annotations

import numpy as np

from genshift.eval import metrics

EXAMPLE_FIELDS = ("pair_id", "edit_type", "original_words", "edit_words")  # shown with each example pair


def cluster_edits(directions, delta_p, *, k: int = 5, seed: int = 0, labels=None, examples: int = 3) -> list[dict]:
    """K-means on edit directions; clusters sorted by decreasing mean Δp.

    Returns per cluster: size, mean Δp, the row indices of its highest-Δp members (``examples``)
    and, if ``labels`` is given, the most common class.
    """
    from sklearn.cluster import KMeans

    x = np.asarray(directions, dtype=np.float64)
    dp = np.asarray(delta_p, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != dp.shape[0]:
        raise ValueError(f"directions must be (n, d) with n = len(delta_p), got {x.shape} and {dp.shape}")
    n = x.shape[0]
    if n == 0:
        return []
    k = max(1, min(k, n))
    norm = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    assign = KMeans(n_clusters=k, n_init=10, random_state=seed).fit_predict(norm)
    out = []
    for c in range(k):
        idx = np.flatnonzero(assign == c)
        if idx.size == 0:
            continue
        top = idx[np.argsort(-dp[idx], kind="stable")][:examples]
        entry = {"cluster": int(c), "size": int(idx.size), "mean_delta_p": float(dp[idx].mean()),
                 "examples": top.tolist()}
        if labels is not None:
            vals, counts = np.unique(np.asarray(labels)[idx], return_counts=True)
            entry["top_label"] = int(vals[counts.argmax()])
        out.append(entry)
    return sorted(out, key=lambda e: -e["mean_delta_p"])


def result_clusters(suite, tables: dict, *, k: int = 5, seed: int = 0) -> dict | None:
    """A LANCE result's analysis ``{"lance_edit_clusters": ...}`` (the family's ``analysis`` target): the
    suite's edit directions clustered, with the predictions' Δp."""
    if not ({"counterfactual", "original"} <= set(tables) and "edit_text_direction" in suite.manifest.features):
        return None
    cols = suite.read_columns("counterfactual", ["image_id", "edit_text_direction", "edit_type", "original_words",
                                                 "edit_words", "pair_id"]).to_pylist()
    meta = {r["image_id"]: r for r in cols}
    orig, cf = tables["original"], tables["counterfactual"]
    match = metrics.pair_up(orig["pair_id"].to_pylist(), cf["pair_id"].to_pylist())
    ok = match >= 0
    dp = metrics.delta_p(orig["true_prob"].to_numpy()[match[ok]], cf["true_prob"].to_numpy()[ok])
    ids = [i for i, good in zip(cf["image_id"].to_pylist(), ok) if good]
    dirs = [meta[i]["edit_text_direction"] for i in ids]
    clusters = cluster_edits(dirs, dp, k=k, seed=seed, labels=cf["label"].to_numpy()[ok])
    for c in clusters:
        c["examples"] = [{"image_id": ids[i], **{f: meta[ids[i]][f] for f in EXAMPLE_FIELDS}, "delta_p": float(dp[i])}
                         for i in c["examples"]]
    return {"lance_edit_clusters": {"method": f"K-means (k={k}) on CLIP text directions edit - original words",
                                    "clusters": clusters}}
