"""A paper's table from a population's results, with the paper's reported numbers beside ours.

``reproduce(table, results)`` matches the results to the table's model population
(``genshift.populations``), reads each cell from the results' metrics and pairs it with the
number the paper reports (package data ``reported.yaml``, each with paper, table and row). It
never runs a model: results come from ``bench eval --models <population>``. The returned report
carries the paper's layout (``layout``: columns and rows of text cells), every cell as a record
(``cells``: ours, paper, ours − paper, source), the models used, the population's missing models
with the command that scores each, and notes on settings that make a number disagree.

Tables:

- ``lance-table2``: LANCE Table 2, acc@1 / acc@5 on Original (T), Reconstructed (the
  reconstructions of T) and LANCE (all counterfactuals T'), T = the result's headline T
  (``metrics.lance.headline_T``: originals with at least one counterfactual, as the paper's
  fractions of 576 show).
- ``in-g-fig4``: IN-G Fig. 4, the top-3 failure rate (true class not in the top 3) of each model
  on IN-G-RN and IN-G-ViT; the paper prints the replicas' rates (78%, 77%) and the range over the
  ImageNet-21k models (39-53%, 50-61%); ours is compared as a range too.
- ``imagenet-star-slopes``: Dataset Interfaces' per-shift absolute impact and ID/OOD slope over
  the 61-model population (``genshift.eval.slope``); the paper plots these, so there is no number beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from genshift.errors import BenchError, unknown
from genshift.identity import timm_name as model_key
from genshift.populations import Member, Population, get_population

TABLES = ("imagenet-star-slopes", "in-g-fig4", "lance-table2")
_SUITES = {"imagenet-star-slopes": ("imagenet-star-upstream", "imagenet-star"), "in-g-fig4": ("in-g-rn", "in-g-vit"),
           "lance-table2": ("lance-hardimagenet",)}


@lru_cache(maxsize=1)
def reported() -> dict[str, dict]:
    """The papers' reported numbers by table (package data ``reported.yaml``)."""
    text = resources.files("genshift").joinpath("_data", "reported.yaml").read_text()
    return {t["table"]: t for t in yaml.safe_load(text)}


def _source(rep: dict, row: str) -> dict:
    return {"paper": rep["paper"], "where": rep["where"], "row": row}


def result_files(paths) -> list[Path]:
    """Result files from paths that are result JSONs or folders (searched for ``result.json``)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.rglob("result.json"))
        elif p.is_file():
            out.append(p)
        else:
            raise BenchError(f"{p}: no such result file or folder; give result.json files or the runs folder")
    if not out:
        raise BenchError(f"no result.json under {', '.join(map(str, paths))}; score the population first "
                         "(bench eval --models <population> --suite <suite>)")
    return out


@dataclass
class Found:
    member: Member
    path: str
    result: dict


def match_population(pop: Population, results: list[tuple[str, dict]], suite: str) -> tuple[dict[str, Found], list[str]]:
    """The population's members among the results of ``suite`` (by model id in normal form; a
    local-checkpoint replica by its architecture and ``source: checkpoint``). Returns found
    members by paper name and the ids of results outside the population."""
    found: dict[str, Found] = {}
    outside = []
    for path, r in results:
        if r["suite"]["id"] != suite:
            continue
        key, local = model_key(r["model"].get("declared_name") or r["model"]["id"]), r["model"].get("source") == "checkpoint"
        hit = next((m for m in pop.members
                    if (m.local and local and key.split(".", 1)[0] == m.model)
                    or (not m.local and not local and key == m.model)), None)
        if hit is None:
            outside.append(r["model"]["id"])
            continue
        if hit.paper in found:
            raise BenchError(f"two results of {hit.paper} ({hit.model}) on {suite}: {found[hit.paper].path} and {path}; "
                             "keep one per model")
        found[hit.paper] = Found(hit, path, r)
    manifests = {f.result["suite"]["manifest_sha256"] for f in found.values()}
    if len(manifests) > 1:
        raise BenchError(f"the results on {suite} come from {len(manifests)} different builds (manifest hashes); "
                         "a table compares models on one build: keep results of one suite revision")
    return found, outside


def _pct(v) -> float | None:
    return None if v is None else 100 * float(v)


def _fmt(values) -> str:
    return " / ".join("-" if v is None else f"{v:.2f}" for v in values)


def _diff(ours, paper) -> str:
    return " / ".join("-" if a is None or b is None else f"{a - b:+.2f}" for a, b in zip(ours, paper))


def _missing_line(m: Member, suite: str, extra: str = "") -> str:
    if m.local:
        return f"{m.paper}: no public weights; train it and run bench eval --model {m.model}=<checkpoint> --suite {suite}{extra}"
    return f"{m.paper}: bench eval --model {m.model} --suite {suite}{extra}"


def _lance_table2(results: list[tuple[str, dict]]) -> dict:
    rep, pop = reported()["lance-table2"], get_population("lance-table2")
    suite = "lance-hardimagenet"
    found, outside = match_population(pop, results, suite)
    cols = [m.paper for m in pop.members]
    notes, cells, rows = [], [], []
    for f in found.values():
        if f.result["suite"]["metric_family"] != "lance":
            raise BenchError(f"{f.path} is not a LANCE result (metric family {f.result['suite']['metric_family']})")
        pre = f.result["protocol"].get("preprocess", "timm")
        if pre != "lance-square":
            notes.append(f"{f.member.paper} was scored with --preprocess {pre}; the paper's setting is lance-square "
                         "(the whole image squashed to 224 px)")

    def ours(f: Found, row: str) -> list[float | None]:
        lance = f.result["metrics"]["lance"]
        t = lance.get("headline_T", "originals_with_counterfactual")
        key = {"1 Original": "acc{k}_T", "2 Reconstructed": "acc{k}_reconstruction"}.get(row)
        out = []
        for k in (1, 5):
            m = lance.get(f"acc{k}_counterfactual") if key is None else (lance.get(key.format(k=k)) or {}).get(t)
            out.append(_pct((m or {}).get("value")))
        return out

    skipped = rep["not_reproduced"]
    for r in rep["rows"]:
        if r["row"] in skipped:
            continue
        block = {"ours": {}, "paper": {}, "ours - paper": {}}
        for col in cols:
            paper = r["values"][col]
            mine = ours(found[col], r["row"]) if col in found else [None, None]
            block["ours"][col], block["paper"][col], block["ours - paper"][col] = _fmt(mine), _fmt(paper), _diff(mine, paper)
            for metric, a, b in zip(rep["metrics"], mine, paper):
                cells.append({"row": r["row"], "column": col, "metric": metric, "ours": a, "paper": b,
                              "diff": None if a is None else a - b, "source": _source(rep, r["row"])})
        for i, (what, vals) in enumerate(block.items()):
            rows.append({"test set": r["row"] if i == 0 else "", "": what, **vals})
    missing = [_missing_line(m, suite, " --preprocess lance-square") for m in pop.members if m.paper not in found]
    return _report("lance-table2", rep, pop, suite, found, outside, cells,
                   {"columns": ["test set", "", *cols], "rows": rows}, notes, missing=missing)


def _in_g_fig4(results: list[tuple[str, dict]]) -> dict:
    rep, pop = reported()["in-g-fig4"], get_population("in-g-fig4")
    suites = dict(zip(rep["columns"], rep["suites"]))
    per_suite = {s: match_population(pop, results, s) for s in rep["suites"]}
    cells, notes = [], []

    def rate(suite: str, paper: str) -> float | None:
        f = per_suite[suite][0].get(paper)
        return None if f is None else _pct(f.result["metrics"]["in_g"]["generated"]["top3_failure_rate"]["value"])

    rows = []
    for m in pop.members:
        row = {"model": m.paper, "role": m.role, "timm": m.model + (" (own checkpoint)" if m.local else "")}
        for col, suite in suites.items():
            f = per_suite[suite][0].get(m.paper)
            v = rate(suite, m.paper)
            flag = " (construction model)" if f is not None and f.result["flags"].get("construction_model") else ""
            row[f"{col} ours"] = ("-" if v is None else f"{v:.2f}") + flag
            paper = next((r for r in rep["rows"] if r["row"] == m.paper and r["suite"] == suite), None)
            row[f"{col} paper"] = "" if paper is None else f"{paper['value']:.0f}"
            row[f"{col} diff"] = "" if paper is None or v is None else f"{v - paper['value']:+.2f}"
            if paper is not None:
                cells.append({"row": m.paper, "column": col, "metric": "top3_failure_rate", "ours": v,
                              "paper": float(paper["value"]), "diff": None if v is None else v - paper["value"],
                              "source": _source(rep, paper["text"])})
        rows.append(row)
    group = [m.paper for m in pop.members if m.role == "in21k"]
    summary = {"model": "ImageNet-21k models", "role": "range", "timm": ", ".join(group)}
    for col, suite in suites.items():
        vals = [rate(suite, p) for p in group]
        have = [v for v in vals if v is not None]
        paper = next(r for r in rep["rows"] if r["row"] == "in21k" and r["suite"] == suite)
        lo, hi = paper["range"]
        ours = (min(have), max(have)) if len(have) == len(group) else None
        summary[f"{col} ours"] = "-" if ours is None else f"{ours[0]:.2f}-{ours[1]:.2f}"
        summary[f"{col} paper"] = f"{lo}-{hi}"
        summary[f"{col} diff"] = "" if ours is None else f"{ours[0] - lo:+.2f}/{ours[1] - hi:+.2f}"
        cells.append({"row": "in21k range", "column": col, "metric": "top3_failure_rate", "ours": ours,
                      "paper": [float(lo), float(hi)],
                      "diff": None if ours is None else [ours[0] - lo, ours[1] - hi], "source": _source(rep, paper["text"])})
        if ours is None and have:
            notes.append(f"{col}: the range needs all {len(group)} ImageNet-21k models; {len(have)} scored")
    rows.append(summary)
    columns = ["model", "role", "timm"] + [f"{c} {w}" for c in suites for w in ("ours", "paper", "diff")]
    found = {f"{p} on {s}": f for s, (fs, _) in per_suite.items() for p, f in fs.items()}
    outside = sorted({o for _, (_, out) in per_suite.items() for o in out})
    rep_missing = [_missing_line(m, s) for s, (fs, _) in per_suite.items() for m in pop.members if m.paper not in fs]
    return _report("in-g-fig4", rep, pop, ",".join(rep["suites"]), found, outside, cells,
                   {"columns": columns, "rows": rows}, notes, missing=rep_missing)


def _imagenet_star_slopes(results: list[tuple[str, dict]]) -> dict:
    from genshift.eval.slope import slope_table

    pop = get_population("imagenet-star-61")
    suite = next((s for s in _SUITES["imagenet-star-slopes"] if any(r["suite"]["id"] == s for _, r in results)),
                 "imagenet-star-upstream")
    found, outside = match_population(pop, results, suite)
    if len(found) < 2:
        raise BenchError(f"the ID/OOD slopes need results of at least 2 of the population's models on {suite}; "
                         f"found {len(found)}")
    table = slope_table([f.result for f in found.values()])
    rows = []
    for shift, fits in table["shifts"].items():
        imp = (table.get("shift_impact") or {}).get(shift) or {}
        rows.append({"shift": shift,
                     "impact pp": "-" if imp.get("value") is None else f"{100 * imp['value']:.2f}",
                     "linear slope": f"{fits['linear']['slope']:.3f}", "linear R^2": f"{fits['linear']['r2']:.3f}",
                     "probit slope": f"{fits['probit']['slope']:.3f}", "probit R^2": f"{fits['probit']['r2']:.3f}",
                     "paper": "plot only"})
    rep = {"title": "Dataset Interfaces: per-shift absolute impact and ID/OOD slope over the model population",
           "paper": "Vendrow, Jain, Engstrom, Madry, Dataset Interfaces (2023)",
           "where": "the blog post's plots (no numbers printed)"}
    return _report("imagenet-star-slopes", rep, pop, suite, found, outside, [],
                   {"columns": list(rows[0]) if rows else ["shift"], "rows": rows}, [])


def _report(name, rep, pop, suite, found, outside, cells, layout, notes, missing=None) -> dict:
    names = {f.member.paper for f in found.values()}
    return {
        "table": name, "title": rep["title"], "paper": rep["paper"], "where": rep["where"],
        "population": pop.name, "suite": suite, "layout": layout, "cells": cells,
        "models": {k: {"id": f.result["model"]["id"], "result": f.path} for k, f in found.items()},
        "missing": missing if missing is not None else [_missing_line(m, suite) for m in pop.members
                                                        if m.paper not in names],
        "outside_population": sorted(outside), "not_reproduced": rep.get("not_reproduced", {}), "notes": notes,
    }


_BUILDERS = {"lance-table2": _lance_table2, "in-g-fig4": _in_g_fig4, "imagenet-star-slopes": _imagenet_star_slopes}


def reproduce(table: str, results: list[tuple[str, dict]]) -> dict:
    """The report of ``table`` (one of ``TABLES``) from ``(path, result)`` pairs."""
    if table not in _BUILDERS:
        raise unknown("paper table", table, TABLES)
    return _BUILDERS[table](results)
