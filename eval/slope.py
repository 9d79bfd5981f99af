"""Cross-model quantities of a shift, from result records (``bench slope``; reused by the leaderboard;
``docs/results.md``, "Cross-model metrics"): the ID/OOD fit of each shift (:func:`slope_table`) and the
paper's absolute impact of a shift, the drop averaged over models (:func:`shift_impact`), not to be
confused with a result's ``model_mean_impact`` (one model's drop averaged over shifts). The ID axis may be
ImageNet-val top-1 per model from timm's results CSV (:func:`read_id_table`; ``docs/reproducing.md``,
``--id-accuracy``): a result is matched on its model's timm name and the input size its eval recorded; a
repeated (model, img_size) row or a result without its row is one error line, never a guess.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genshift.errors import BenchError
from genshift.eval.metrics import id_ood_fit
from genshift.fsutil import read_text_limited
from genshift.identity import timm_name

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


MAX_ID_CSV_BYTES = 16 * 2**20


@dataclass(frozen=True)
class IdRow:
    top1: float              # fraction
    img_size: int | None     # None: the CSV has no img_size column
    line: int


@dataclass(frozen=True)
class IdTable:
    path: str
    rows: dict[str, dict[int | None, IdRow]]   # model key -> img_size -> row


def read_id_table(path) -> IdTable:
    """Parse a results CSV (``model``, ``top1`` in percent, optional ``img_size``)."""
    p = Path(path)
    if not p.exists():
        raise BenchError(f"--id-accuracy {path}: no such file; give timm's results-imagenet.csv or a CSV of "
                         "model,img_size,top1")
    text = read_text_limited(p, max_bytes=MAX_ID_CSV_BYTES, what="--id-accuracy CSV")  # bounded whatever st_size says
    reader = csv.DictReader(io.StringIO(text))
    fields = {(f or "").strip() for f in reader.fieldnames or []}
    if not {"model", "top1"} <= fields:
        raise BenchError(f"--id-accuracy {path}: needs columns 'model' and 'top1' (percent, as timm's "
                         f"results-imagenet.csv), found {', '.join(sorted(fields)) or 'none'}")
    sized = "img_size" in fields
    rows: dict[str, dict[int | None, IdRow]] = {}
    for n, raw in enumerate(reader, 2):
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items() if isinstance(v, str)}
        if not row.get("model"):
            continue
        where = f"--id-accuracy {path}:{n}"
        try:
            top1 = float(row.get("top1", ""))
            size = int(row["img_size"]) if sized else None
        except ValueError:
            raise BenchError(f"{where}: top1 {row.get('top1', '')[:20]!r} / img_size {row.get('img_size', '')[:20]!r} "
                             "is not a number") from None
        if not math.isfinite(top1) or not 0 <= top1 <= 100:
            raise BenchError(f"{where}: top1 {top1} is not a percentage in [0, 100]")
        key = timm_name(row["model"])
        by_size = rows.setdefault(key, {})
        if size in by_size:
            at = f" at img_size {size}" if sized else ""
            raise BenchError(f"{where}: {key}{at} is listed twice (also line {by_size[size].line}); keep one row per "
                             f"(model, img_size){'' if sized else ' or add an img_size column'}")
        by_size[size] = IdRow(top1 / 100, size, n)
    if not rows:
        raise BenchError(f"--id-accuracy {path} has no rows")
    return IdTable(str(path), rows)


def eval_img_size(result: dict) -> int | None:
    """The input size a result's eval ran at (``data_config.input_size`` = [C, H, W])."""
    size = (result.get("data_config") or {}).get("input_size")
    return int(size[-1]) if isinstance(size, (list, tuple)) and size else None


def id_accuracy(results: list[dict], table: IdTable) -> tuple[dict[str, float], dict[str, int | None]]:
    """Per result's model id: the CSV's top-1 at the eval's input size, and the size used; a result without its
    row is one error line (what the CSV has for the model instead, or that it lacks the model)."""
    acc, used, problems = {}, {}, []
    for r in results:
        mid = r["model"]["id"]
        key, size = timm_name(mid), eval_img_size(r)
        by_size = table.rows.get(key)
        row = None if by_size is None else by_size.get(size, by_size.get(None))
        if row is None:
            if by_size is None:
                problems.append(f"{mid} (as {key!r}) has no row")
            else:
                have = ", ".join(str(s) for s in sorted(s for s in by_size if s is not None))
                problems.append(f"{mid} was evaluated at {size} px but its rows are at {have} px")
            continue
        acc[mid], used[mid] = row.top1, row.img_size
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BenchError(f"--id-accuracy {table.path}: {problems[0]}{more}; add the row(s) or leave the model out")
    return acc, used
