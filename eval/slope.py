"""Cross-model quantities of a shift, from result records (``bench slope``; reused by the leaderboard;
``docs/results.md``, "Cross-model metrics"): the ID/OOD fit of each shift (:func:`slope_table`) and the
paper's absolute impact of a shift, the drop averaged over models (:func:`shift_impact`), not to be
confused with a result's ``model_mean_impact`` (one model's drop averaged over shifts).
"""

from __future__ import annotations

import numpy as np

from genshift.errors import BenchError
from genshift.eval.metrics import id_ood_fit

SCALES = ("linear", "probit")
SMALL_N = 5  # fewer models than this: the fit's slope and R^2 say little (a warning goes with the table)


def _acc1(result: dict, config: str) -> float | None:
    m = result["metrics"]["configs"].get(config)
    return None if m is None else m["acc1"]["value"]


def _scoring_but_reference(result: dict) -> tuple[dict, bool]:
    """The scoring protocol without ``reference_accuracy`` (each model's own ImageNet-val accuracy
    from ``bench eval --reference-accuracy A`` differs per model by design), and whether one is set."""
    sc = dict(result["protocol"]["scoring"])
    return sc, sc.pop("reference_accuracy", None) is not None


def _check_comparable(results: list[dict]) -> None:
    """One suite (same manifest hash), one scoring protocol, one result per model. Results made
    with ``--reference-accuracy`` combine when that per-model reference is their only difference
    (all of them must have one: the drops of the others are against ``base``, another quantity)."""
    first = results[0]
    first_sc, first_given = _scoring_but_reference(first)
    for r in results[1:]:
        sc, given = _scoring_but_reference(r)
        if r["suite"]["manifest_sha256"] != first["suite"]["manifest_sha256"]:
            raise BenchError(f"result of {r['model']['id']} uses another suite data (manifest hash) than "
                             f"{first['model']['id']}; fit only results of the same suite revision and protocol")
        if sc != first_sc:
            raise BenchError(f"result of {r['model']['id']} uses another scoring protocol than {first['model']['id']}; "
                             "fit only results of the same suite revision and protocol")
        if given != first_given:
            with_ref, without = (r, first) if given else (first, r)
            raise BenchError(f"result of {with_ref['model']['id']} measures drops against a given accuracy "
                             f"(--reference-accuracy) and {without['model']['id']} against the suite's reference "
                             "config; re-run one of them so all use the same kind of reference")
    models = [r["model"]["id"] for r in results]
    if len(set(models)) != len(models):
        raise BenchError("two results of the same model; keep one per model")


def shift_impact(drops, *, confidence: float = 0.95) -> dict:
    r"""The absolute impact of one shift (Dataset Interfaces): the drop in accuracy averaged over models.

    .. math:: \mathrm{impact}(s) = \frac{1}{M}\sum_{m=1}^{M} \big(\mathrm{acc}_m(\mathrm{ref}) - \mathrm{acc}_m(s)\big)

    ``drops`` are the M models' drops (each result's ``absolute_impact`` of the shift; ``None``
    / nan are left out). The interval is over models: mean ± t(1 − α/2, M − 1) · sd / √M
    (sample sd); with one model there is a value and no interval. Returns the usual metric record
    ``{"value", "ci", "n"}`` with ``n`` = number of models.

    >>> m = shift_impact([0.1, 0.2, 0.3])
    >>> round(m["value"], 6), [round(x, 4) for x in m["ci"]], m["n"]
    (0.2, [-0.0484, 0.4484], 3)
    """
    from scipy.stats import t as student_t

    x = np.array([np.nan if v is None else v for v in drops], dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"value": None, "ci": None, "n": 0}
    mean = float(x.mean())
    if x.size < 2:
        return {"value": mean, "ci": None, "n": 1}
    half = float(student_t.ppf(1 - (1 - confidence) / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return {"value": mean, "ci": [mean - half, mean + half], "n": int(x.size)}


def shift_impact_table(results: list[dict], *, confidence: float = 0.95) -> dict[str, dict]:
    """``shift_impact`` of every shift the results share, from their per-model ``absolute_impact``; the results
    must be comparable (:func:`_check_comparable`) and of the ImageNet* family."""
    if not results:
        return {}
    _check_comparable(results)
    per_model = []
    for r in results:
        star = r["metrics"].get("imagenet_star")
        if star is None:
            raise BenchError(f"result of {r['model']['id']} has no ImageNet* metrics; shift impact is defined for "
                             "imagenet_star results only")
        per_model.append(star.get("absolute_impact", {}))
    shifts = sorted(set.intersection(*(set(d) for d in per_model)))
    return {s: shift_impact([d[s]["value"] for d in per_model], confidence=confidence) for s in shifts}


def slope_table(results: list[dict], *, reference_config: str | None = None,
                id_accuracy: dict[str, float] | None = None, scales: tuple[str, ...] = SCALES) -> dict:
    """Per shift: the fit on each scale and each model's effective robustness; plus, for ImageNet* results, each
    shift's ``shift_impact``. The results must be comparable (:func:`_check_comparable`)."""
    if len(results) < 2:
        raise BenchError(f"an ID/OOD fit needs results of at least 2 models, got {len(results)}")
    _check_comparable(results)
    first = results[0]
    models = [r["model"]["id"] for r in results]
    ref = reference_config or first["protocol"]["scoring"].get("reference_config") or "base"
    if id_accuracy is not None:
        missing = [m for m in models if m not in id_accuracy]
        if missing:
            raise BenchError(f"no in-distribution accuracy given for {missing[0]!r}")
        x = [float(id_accuracy[m]) for m in models]
        id_desc = "given"
    else:
        x = [_acc1(r, ref) for r in results]
        if any(v is None for v in x):
            raise BenchError(f"reference config {ref!r} is missing from some results; evaluate it or give ID "
                             "accuracies")
        id_desc = f"config {ref}"
    shifts = sorted(set.intersection(*(set(r["metrics"]["configs"]) for r in results)) - {ref})
    table = {}
    for s in shifts:
        y = [_acc1(r, s) for r in results]
        keep = [i for i, v in enumerate(y) if v is not None]
        table[s] = {scale: {**id_ood_fit([x[i] for i in keep], [y[i] for i in keep], scale=scale),
                            "models": [models[i] for i in keep]} for scale in scales}
    out = {"id_axis": id_desc, "models": models, "id_accuracy": x, "shifts": table, "warnings": []}
    if len(models) < SMALL_N:
        out["warnings"].append(f"only {len(models)} models: a line through fewer than {SMALL_N} points is fragile "
                               "(one model moves the slope and R^2); score more models before reading it")
    if all("imagenet_star" in r["metrics"] for r in results):
        out["shift_impact"] = shift_impact_table(results)
    return out
