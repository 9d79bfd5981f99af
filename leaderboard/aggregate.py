"""Aggregation: one row per model, cross-model fits, and ranks with paired-bootstrap intervals
(``docs/leaderboard.md``, "What the app shows"): pure functions of the entries' records (``genshift.eval.stamps``);
only a model's drilldown reads a predictions file. The ID/OOD fits are ``genshift.eval.slope.slope_table``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from genshift.errors import BenchError
from genshift.eval import bootstrap
from genshift.families import get_family
from genshift.identity import timm_name

PRETRAIN_RULES = (
    (r"laion|datacomp|dfn|openai|clip|webli|merged2b", "image-text"),
    (r"in22k|in21k|in12k|22k|21k", "in21k/22k"),
    (r"ig1b|ig3b|swsl|instagram", "instagram"),
    (r"yfcc|ssl", "yfcc100m"),
    (r"jft", "jft"),
)


def family_of(architecture: str) -> str:
    """Architecture family from a timm name: ``tf_efficientnet_lite0`` -> ``efficientnet``."""
    name = re.sub(r"^(tf|tv|gluon|legacy|ssl|swsl|ig)_", "", architecture)
    head = name.split("_")[0]
    return re.sub(r"\d+[a-z]?$", "", head) or head


def pretraining_of(tag: str | None) -> str:
    """Pretraining data from a timm tag (documented heuristic): in1k unless the tag says otherwise."""
    t = (tag or "").lower()
    for pattern, label in PRETRAIN_RULES:
        if re.search(pattern, t):
            return label
    return "in1k"


def not_ranked_because(entry) -> str:
    """Why an accepted entry is not ranked, or "" if it is (``docs/leaderboard.md``, "What is ranked")."""
    from genshift.eval.stamps import unrankable

    if entry.record["flags"]["construction_model"]:
        return "construction model (used to build the suite: biased by construction, never ranked)"
    return unrankable(entry.record).split(";")[0] or ("" if entry.verified else entry.note)


def base_config(doc: dict) -> str | None:
    """The reference config a family scores its shifts against (``Family.reference``: ImageNet*'s base), if any."""
    ref = doc["protocol"]["scoring"].get("reference_config") or "base"
    return ref if get_family(doc["suite"]["metric_family"]).reference and ref in doc["suite"]["configs"] else None


def model_table(entries) -> pd.DataFrame:
    """One row per model of a board: identity, trust, model facts, flags, ``Family.columns`` (fractions) and
    ``base_acc1``. An entry that cannot be tabulated is left out and named in ``df.attrs["skipped"]``."""
    rows, skipped = [], []
    for e in entries:
        try:
            doc, why = e.record, not_ranked_because(e)
            m, base = doc["model"], base_config(doc)
            cols, papers = get_family(doc["suite"]["metric_family"]).columns(doc), m.get("paper_ids")
            rows.append({
                "model": str(m["id"]), "weights": "local weights" if e.identity.local else "Hub",
                "verified": e.verified, "ranked": not why, "not_ranked_because": why, "flags": "; ".join(e.flags),
                "architecture": str(m.get("architecture") or ""),
                "family": family_of(str(m.get("architecture") or str(m["id"]).split("/")[-1].split("@")[0])),
                "pretraining": pretraining_of(m.get("tag")), "params_m": (m.get("num_params") or 0) / 1e6,
                "construction_model": bool(doc["flags"].get("construction_model")),
                "partial": bool(doc["flags"].get("partial")) or doc["protocol"]["limit_per_class"] is not None,
                "pinned_suite": not doc["flags"].get("unpinned_suite"),
                "base_acc1": cols.get(f"acc1/{base}", np.nan) if base else np.nan, **cols,
                "paper": ",".join(str(p) for p in papers) if isinstance(papers, list) else str(papers or ""),
            })
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as ex:
            skipped.append((str(e.model_id), f"cannot be tabulated ({type(ex).__name__}: {ex})"))
    df = pd.DataFrame(rows)
    df.attrs["skipped"] = skipped
    return df


def hit_matrix(entries, config: str) -> np.ndarray | None:
    """Per-image headline hits of every model on one config, ``(n, M)``, from their records; None unless all models
    were scored on the same images in the same order."""
    from genshift.eval.stamps import hits

    try:
        return hits([e.record for e in entries], config)[1]
    except (KeyError, TypeError, ValueError):
        return None


SCORE_DECIMALS = 12  # scores equal to 12 decimals are ties (float noise never splits a tie)


@dataclass
class RankInterval:
    rank: int
    lo: int
    hi: int
    value_lo: float = float("nan")   # percentile interval of the headline metric itself
    value_hi: float = float("nan")


def headline_replicates(entries, *, family: str, configs: list[str], n_boot: int = 1000,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """The family's headline metric for every model, ``(point (M,), replicates (B, M), higher_is_better)``, from the
    records' per-image outcomes resampled identically for all models (``docs/leaderboard.md``, "What the app
    shows"); None if the image sets differ."""
    import base64

    from genshift.eval import scoring

    fam = get_family(family)
    if fam.rank_paired_delta:
        h_o, h_c = hit_matrix(entries, "original"), hit_matrix(entries, "counterfactual")
        matches = {e.record["correct"]["counterfactual"].get("match") for e in entries}
        if h_o is None or h_c is None or len(matches) != 1 or None in matches:
            return None
        match = np.frombuffer(base64.b64decode(matches.pop()), dtype="<i4").astype(np.int64)
        if (match < 0).any():
            return None
        n = h_o.shape[0]
        mask = np.ones(n, bool) if scoring.LANCE_HEADLINE_T == "all_originals" else np.isin(np.arange(n), match)
        w = scoring.lance_pair_weights(n, scoring.ScoringOptions(n_boot=n_boot, seed=seed))
        d = scoring.delta_acc_replicates(h_o, h_c, match, mask, w)
        return d.delta, d.delta_reps, True
    reps, point = 0.0, 0.0  # sums over the configs, added in config order
    for c in configs:
        hits = hit_matrix(entries, c)
        if hits is None:
            return None
        values = ~hits if fam.rank_misses else hits
        reps = reps + bootstrap.paired_mean_replicates(values, n_boot=n_boot, seed=seed, key=c)
        point = point + values.mean(axis=0)
    return point / len(configs), reps / len(configs), fam.headline_metric.higher_is_better


def rank_intervals(entries, *, family: str, configs: list[str], n_boot: int = 1000, seed: int = 0,
                   confidence: float = 0.95) -> dict[str, RankInterval] | None:
    """Ranks by :func:`headline_replicates` (1 = best; ties share the better rank) with percentile intervals of each
    model's rank and headline value over the shared replicates; None unless the image sets are identical."""
    if not entries or (not get_family(family).rank_paired_delta and not configs):
        return None
    h = headline_replicates(entries, family=family, configs=configs, n_boot=n_boot, seed=seed)
    if h is None:
        return None
    score, rep, higher = h
    ranks = point_ranks(score, higher=higher).astype(int)
    rep, sign = np.round(rep, SCORE_DECIMALS), -1.0 if higher else 1.0
    alpha = (1 - confidence) / 2
    # a tie spans the ranks it could take: the interval runs from the best to the worst of them
    replicate_ranks = pd.DataFrame(sign * rep)  # a row per replicate; pandas ranks as point_ranks does
    lo = np.floor(np.quantile(replicate_ranks.rank(axis=1, method="min").to_numpy(), alpha, axis=0)).astype(int)
    hi = np.ceil(np.quantile(replicate_ranks.rank(axis=1, method="max").to_numpy(), 1 - alpha, axis=0)).astype(int)
    vlo, vhi = np.quantile(rep, alpha, axis=0), np.quantile(rep, 1 - alpha, axis=0)
    return {e.model_id: RankInterval(int(ranks[i]), int(lo[i]), int(hi[i]), float(vlo[i]), float(vhi[i]))
            for i, e in enumerate(entries)}


def point_ranks(values, *, higher: bool) -> np.ndarray:
    """Competition ranks (1, 1, 3) of values (NaN: unranked), ties to ``SCORE_DECIMALS`` decimals."""
    v = np.round(np.asarray(values, dtype=np.float64), SCORE_DECIMALS)
    return pd.Series(v).rank(method="min", ascending=not higher).to_numpy()  # NaN stays unranked


def board_table(entries, *, ranks: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """One board as the page shows it: :func:`model_table` sorted by rank (ties: by model), ranks over its ranked
    entries only: ``ranks`` (:func:`rank_intervals`) or, without them, point ranks. Also the ``meta`` a view needs:
    ``family``, ``metric``, ``higher``, ``metric_label``, ``configs``, ``rank_configs``, ``base``, ``skipped``."""
    df, family, base = model_table(entries), entries[0].record["suite"]["metric_family"], base_config(entries[0].record)
    head = get_family(family).headline_metric
    metric, higher = head.key, head.higher_is_better
    configs = sorted(c[len("acc1/"):] for c in df.columns if c.startswith("acc1/"))
    meta = {"family": family, "metric": metric, "higher": higher, "metric_label": head.label, "configs": configs,
            "rank_configs": get_family(family).rank_configs(configs, base), "base": base,
            "skipped": [list(s) for s in df.attrs.get("skipped", [])]}
    get = lambda f: [getattr(ranks[m], f) if m in ranks else np.nan for m in df["model"]]  # noqa: E731
    if ranks:
        df["rank"], df["rank_lo"], df["rank_hi"] = get("rank"), get("lo"), get("hi")
    else:  # no intervals (yet, or the image sets differ): point ranks only
        ranked = df[df["ranked"]]
        by_model = dict(zip(ranked["model"], point_ranks(ranked[metric], higher=higher)))
        df["rank"] = [by_model.get(m, np.nan) for m in df["model"]]
        df["rank_lo"] = df["rank_hi"] = np.nan
    for col, f in ((f"{metric}_lo", "value_lo"), (f"{metric}_hi", "value_hi")):
        if col not in df.columns or df[col].isna().all():
            df[col] = get(f) if ranks else np.nan
    # unranked rows (rank NaN) last, by metric and model as ranked ties are
    df = df.sort_values(["rank", metric, "model"], ascending=[True, not higher, True], na_position="last")
    return df.reset_index(drop=True), meta


MIN_FIT_MODELS = 5  # fewer models than this: the ID/OOD line is shown with a warning


def fit_band(x, y, grid, *, scale: str = "linear", confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    r"""Pointwise confidence band of the least-squares ID/OOD line (``genshift.eval.metrics.id_ood_fit``) at ``grid``.

    On the fit's scale :math:`g` (identity or probit), the mean response at :math:`x_0` has standard
    error (ordinary least squares, e.g. Montgomery et al., *Introduction to Linear Regression
    Analysis*, eq. 2.43)

    .. math:: \mathrm{se}(x_0) = s\sqrt{1/n + (x_0-\bar x)^2 / S_{xx}}, \qquad s^2 = \mathrm{SS_{res}}/(n-2)

    and the band is :math:`\hat y(x_0) \pm t_{1-\alpha/2,\,n-2}\,\mathrm{se}(x_0)`, mapped back to
    accuracy with :math:`g^{-1}`. NaN with fewer than 3 models (no residual degrees of freedom).
    """
    from scipy.stats import norm, t

    from genshift.eval.metrics import probit

    g = probit if scale == "probit" else np.asarray
    gx, gy, gg = (g(np.asarray(v, float)) for v in (x, y, grid))
    n = gx.size
    nan = np.full(gg.shape, np.nan)
    if n < 3 or np.ptp(gx) == 0:
        return nan, nan
    slope, intercept = np.polyfit(gx, gy, 1)
    s2 = float(((gy - (slope * gx + intercept)) ** 2).sum()) / (n - 2)
    sxx = float(((gx - gx.mean()) ** 2).sum())
    se = np.sqrt(s2 * (1 / n + (gg - gx.mean()) ** 2 / sxx))
    q = t.ppf(1 - (1 - confidence) / 2, n - 2)
    lo, hi = slope * gg + intercept - q * se, slope * gg + intercept + q * se
    return (lo, hi) if scale == "linear" else (norm.cdf(lo), norm.cdf(hi))


def read_id_accuracy(path) -> dict[str, dict[int | None, float]]:
    """ImageNet-val top-1 by bare timm name, then input size (None: no ``img_size`` column): ``read_id_table``'s."""
    from genshift.eval.slope import read_id_table

    return {m: {size: row.top1 for size, row in by_size.items()} for m, by_size in read_id_table(path).rows.items()}


def eval_sizes(entries) -> dict[str, int | None]:
    """Model id -> the input size its eval ran at, for :func:`join_id_accuracy`."""
    from genshift.eval.slope import eval_img_size

    return {e.model_id: eval_img_size(e.record) for e in entries}


def join_id_accuracy(models, table: dict, sizes: dict | None = None) -> tuple[dict[str, float], list[str]]:
    """Match result model ids to the CSV's rows: the bare timm name (``genshift.identity.timm_name``) at the
    model's eval input size (``sizes``) where the CSV has sizes, else (or the size unknown) its only row; a model
    listed at two sizes is never guessed. Returns (model id -> accuracy of the matched, unmatched model ids)."""
    matched, unmatched = {}, []
    for m in models:
        by_size, size = table.get(timm_name(m), {}), (sizes or {}).get(m)
        if size is not None and None not in by_size:
            hit = by_size.get(size)
        else:
            hit = next(iter(by_size.values())) if len(by_size) == 1 else None
        if hit is None:
            unmatched.append(m)
        else:
            matched[m] = hit
    return matched, unmatched


def slope_fits(entries, *, id_accuracy: dict[str, float] | None = None) -> dict | None:
    """ID/OOD fits per shift (``slope_table``) of the models ``id_accuracy`` names (all if None); None under 2."""
    from genshift.eval.slope import slope_table

    # a record carries what slope_table reads of a result
    results = [e.record for e in entries if id_accuracy is None or e.model_id in id_accuracy]
    if len(results) < 2:
        return None
    try:
        return slope_table(results, id_accuracy=id_accuracy)
    except BenchError:
        return None


def per_class_accuracy(entry, config: str) -> pd.DataFrame:
    """acc@1 per class of one model on one config (for the drilldown's worst classes)."""
    from genshift import imagenet

    t = entry.read_predictions(config, ["label", "keep", "true_rank"])  # hashed against the record first
    if entry.record["protocol"]["scoring"]["filter"]:
        t = t.filter(t["keep"])
    df = pd.DataFrame({"label": t["label"].to_numpy(), "hit": t["true_rank"].to_numpy() == 0})
    out = df.groupby("label")["hit"].agg(["mean", "size"]).reset_index()
    out["class"] = [f"{imagenet.names()[i]} ({imagenet.wnids()[i]})" for i in out["label"]]
    return out.rename(columns={"mean": "acc1", "size": "n"}).sort_values(["acc1", "n"], ascending=[True, False])


REPORTED_METRICS = {"acc1": "acc@1 %", "acc5": "acc@5 %", "top3_failure_rate": "top-3 failure rate %"}


def reported_frame(suite: str | None = None) -> pd.DataFrame:
    """One row per reported number: paper, where, row, model (the paper's name), timm tag (our
    population's choice, empty where the paper's model is not a timm classifier), metric, value."""
    from genshift.eval.reproduce import reported
    from genshift.suites import get_population

    rows = []
    for rep in reported().values():
        if suite is not None and suite not in rep["suites"]:
            continue
        members = get_population(rep["population"]).members
        tags = {m.paper: m.model + (" (own checkpoint)" if m.local else "") for m in members}
        source = {"paper": rep["paper"], "where": rep["where"]}
        for r in rep["rows"]:
            if "values" in r:  # a table: the paper's row x model columns
                rows += [{"suite": rep["suites"][0], "row": r["row"], "model": model, "timm": tags.get(model, ""),
                          "metric": REPORTED_METRICS[metric], "reported": f"{v:.2f}", **source}
                         for model, values in r["values"].items() for metric, v in zip(rep["metrics"], values)]
            else:  # a number or range stated in the text for one model or a group
                group = [m.paper for m in members if r["row"] in (m.paper, m.role)]
                value = f"{r['value']:.0f}" if "value" in r else f"{r['range'][0]}-{r['range'][1]}"
                rows.append({"suite": r["suite"], "row": r["text"], "model": ", ".join(group),
                             "timm": ", ".join(tags[m] for m in group), "metric": REPORTED_METRICS[rep["metrics"][0]],
                             "reported": value, **source})
    frame = pd.DataFrame(rows, columns=["suite", "row", "model", "timm", "metric", "reported", "paper", "where"])
    return frame if suite is None else frame[frame["suite"] == suite].reset_index(drop=True)
