"""A paper's table from a population's results, with the paper's reported numbers beside ours.

Results fill a member's row by model identity (``genshift.identity``), never by architecture alone; each
cell is paired with the number the paper reports (package data ``reported.yaml``); no model is run. The
matching rules, the tables and what each cell reads: ``docs/reproducing.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml

from genshift.errors import BenchError, unknown
from genshift.families import get_family
from genshift.identity import LOCAL_ID, check_id, timm_name
from genshift.suites import Member, Population, get_population

TABLES = ("imagenet-star-slopes", "in-g-fig4", "lance-table2")


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
    weights: str  # how the result's weights fill the member's row


def check_members(pop: Population, members: dict[str, str] | None) -> dict[str, str]:
    """``{paper name: canonical local id}`` for the members without public weights, checked."""
    local = [m.paper for m in pop.members if m.local]
    for paper, mid in (members or {}).items():
        if paper not in local:
            raise BenchError(f"--member {paper}=...: {pop.name} has no member {paper!r} without public weights "
                             f"(those are {', '.join(local) or 'none'}; the others are matched by their weights)")
        if not LOCAL_ID.fullmatch(check_id(mid)):
            raise BenchError(f"--member {paper}={mid}: give the local weights' model id (<arch>@sha256:<16 hex>, "
                             "the result's model.id)")
    return dict(members or {})


def _member_of(pop: Population, model: dict, members: dict[str, str]) -> tuple[Member | None, str]:
    """The member whose row a result's weights fill, and how (or None and why not)."""
    mid, public = model["id"], {m.model: m for m in pop.members if not m.local}
    if model.get("source") == "hf-hub":
        tag, rev = timm_name(mid), model.get("weights_revision") or "unpinned"
        return public.get(tag), f"Hub weights {tag}@{rev[:12]}" if tag in public else f"{tag}: not a member's weights"
    digest = mid.split("@sha256:", 1)[1] if "@sha256:" in mid else (model.get("tensors_sha256") or "?")[:16]
    named = next((p for p, i in members.items() if i == mid), None)
    if named is not None:
        return next(m for m in pop.members if m.paper == named), f"your weights for {named} (sha256:{digest})"
    declared = timm_name(model.get("declared_name") or "")
    if declared in public:
        return public[declared], f"declared local weights {declared} (sha256:{digest})"
    return None, ("local weights declared as " + declared if declared else "local weights, undeclared") + \
        "; name a member's tag (bench eval --model TAG=FILE) or a replica (--member)"


def match_population(pop: Population, results: list[tuple[str, dict]], suite: str,
                     members: dict[str, str] | None = None) -> tuple[dict[str, Found], list[str]]:
    """The population's members among the results of ``suite`` (see the module docstring). Returns
    found members by paper name and "id: why" lines of the results outside the population."""
    members = check_members(pop, members)
    found: dict[str, Found] = {}
    outside = []
    for path, r in results:
        if r["suite"]["id"] != suite:
            continue
        hit, how = _member_of(pop, r["model"], members)
        if hit is None:
            outside.append(f"{r['model']['id']} ({how})")
            continue
        if hit.paper in found:
            raise BenchError(f"two results of {hit.paper} ({hit.model}) on {suite}: {found[hit.paper].path} and "
                             f"{path}; keep one per model")
        found[hit.paper] = Found(hit, path, r, how)
    manifests = {f.result["suite"]["manifest_sha256"] for f in found.values()}
    if len(manifests) > 1:
        raise BenchError(f"the results on {suite} come from {len(manifests)} different builds (manifest hashes); "
                         "a table compares models on one build: keep results of one suite revision")
    return found, outside


def _pct(v) -> float | None:
    return None if v is None else 100 * float(v)


def _fmt(values, spec: str = ".2f") -> str:
    return " / ".join("-" if v is None else format(v, spec) for v in values)


def _diff(ours, paper) -> list[float | None]:
    return [None if a is None or b is None else a - b for a, b in zip(ours, paper)]


def _missing_line(m: Member, suite: str, extra: str = "") -> str:
    if m.local:
        return (f"{m.paper}: no public weights; train it, run bench eval --model {m.model}=<checkpoint> --suite {suite}"
                f"{extra}, then bench reproduce ... --member {m.paper}=<its model id>")
    return f"{m.paper}: bench eval --model {m.model} --suite {suite}{extra}"


_LANCE_ROWS = {"1 Original": ("acc{k}_T", None),
               "2 Reconstructed": ("acc{k}_reconstruction", "delta_acc{k}_reconstruction"),
               "4 LANCE": ("acc{k}_counterfactual", "delta_acc{k}")}


def _lance_cells(result: dict, row: str) -> tuple[list, list]:
    """Our (acc@1, acc@5) and (Δacc@1, Δacc@5) in percent for one Table 2 row, at the headline T."""
    lance = result["metrics"]["lance"]
    t = lance.get("headline_T", "originals_with_counterfactual")
    acc_key, delta_key = _LANCE_ROWS[row]

    def read(key, k):
        v = lance.get(key.format(k=k)) or {}
        v = v.get(t, v)  # per T, or one set (T')
        return _pct(v.get("value") if isinstance(v, dict) else v)

    return [read(acc_key, k) for k in (1, 5)], [None if delta_key is None else read(delta_key, k) for k in (1, 5)]


def _lance_table2(results: list[tuple[str, dict]], members=None) -> dict:
    rep, pop = reported()["lance-table2"], get_population("lance-table2")
    suite = "lance-hardimagenet"
    found, outside = match_population(pop, results, suite, members)
    cols = [m.paper for m in pop.members]
    notes, cells, rows = [], [], []
    for f in found.values():
        if f.result["suite"]["metric_family"] != "lance":
            raise BenchError(f"{f.path} is not a LANCE result (metric family {f.result['suite']['metric_family']})")
        pre = f.result["protocol"].get("preprocess", "timm")
        if pre != "lance-square":
            notes.append(f"{f.member.paper} was scored with --preprocess {pre}; the paper's setting is lance-square "
                         "(the whole image squashed to 224 px)")
    for r in rep["rows"]:
        if r["row"] in rep["not_reproduced"]:
            continue
        lines = {w: {} for w in ("ours", "paper", "ours - paper", "Δ ours", "Δ paper", "Δ ours - Δ paper")}
        for col in cols:
            acc, delta = _lance_cells(found[col].result, r["row"]) if col in found else ([None] * 2, [None] * 2)
            paper, paper_delta = r["values"][col], (r.get("deltas") or {}).get(col)
            lines["ours"][col], lines["paper"][col] = _fmt(acc), _fmt(paper)
            lines["ours - paper"][col] = _fmt(_diff(acc, paper), "+.2f")
            for metric, a, b in zip(rep["metrics"], acc, paper):
                cells.append({"row": r["row"], "column": col, "metric": metric, "ours": a, "paper": b,
                              "diff": None if a is None else a - b, "source": _source(rep, r["row"])})
            if paper_delta is None:
                continue
            lines["Δ ours"][col], lines["Δ paper"][col] = _fmt(delta, "+.2f"), _fmt(paper_delta, "+.1f")
            lines["Δ ours - Δ paper"][col] = _fmt(_diff(delta, paper_delta), "+.2f")
            for metric, a, b in zip(rep["metrics"], delta, paper_delta):
                cells.append({"row": r["row"], "column": col, "metric": f"delta_{metric}", "ours": a, "paper": b,
                              "diff": None if a is None else a - b, "source": _source(rep, r["row"] + " (subscript)")})
        shown = [(w, v) for w, v in lines.items() if v]
        rows += [{"test set": r["row"] if i == 0 else "", "": w, **v} for i, (w, v) in enumerate(shown)]
    missing = [_missing_line(m, suite, " --preprocess lance-square") for m in pop.members if m.paper not in found]
    return _report("lance-table2", rep, pop, suite, found, outside, cells,
                   {"columns": ["test set", "", *cols], "rows": rows}, notes, missing)


def _in_g_fig4(results: list[tuple[str, dict]], members=None) -> dict:
    rep, pop = reported()["in-g-fig4"], get_population("in-g-fig4")
    suites = dict(zip(rep["columns"], rep["suites"]))
    per_suite = {s: match_population(pop, results, s, members) for s in rep["suites"]}
    cells, notes, rows = [], [], []

    def rate(suite: str, paper: str) -> float | None:
        f = per_suite[suite][0].get(paper)
        return None if f is None else _pct(get_family("in_g").columns(f.result)["top3_failure_rate"])

    for m in pop.members:
        row = {"model": m.paper, "role": m.role, "timm": m.model + (" (own checkpoint)" if m.local else "")}
        for col, suite in suites.items():
            f, v = per_suite[suite][0].get(m.paper), rate(suite, m.paper)
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
        have = [v for v in (rate(suite, p) for p in group) if v is not None]
        paper = next(r for r in rep["rows"] if r["row"] == "in21k" and r["suite"] == suite)
        lo, hi = paper["range"]
        ours = (min(have), max(have)) if len(have) == len(group) else None
        summary[f"{col} ours"] = "-" if ours is None else f"{ours[0]:.2f}-{ours[1]:.2f}"
        summary[f"{col} paper"] = f"{lo}-{hi}"
        summary[f"{col} diff"] = "" if ours is None else f"{ours[0] - lo:+.2f}/{ours[1] - hi:+.2f}"
        cells.append({"row": "in21k range", "column": col, "metric": "top3_failure_rate", "ours": ours,
                      "paper": [float(lo), float(hi)],
                      "diff": None if ours is None else [ours[0] - lo, ours[1] - hi],
                      "source": _source(rep, paper["text"])})
        if ours is None and have:
            notes.append(f"{col}: the range needs all {len(group)} ImageNet-21k models; {len(have)} scored")
    rows.append(summary)
    columns = ["model", "role", "timm"] + [f"{c} {w}" for c in suites for w in ("ours", "paper", "diff")]
    found = {f"{p} on {s}": f for s, (fs, _) in per_suite.items() for p, f in fs.items()}
    outside = sorted({o for _, (_, out) in per_suite.items() for o in out})
    missing = [_missing_line(m, s) for s, (fs, _) in per_suite.items() for m in pop.members if m.paper not in fs]
    return _report("in-g-fig4", rep, pop, ",".join(rep["suites"]), found, outside, cells,
                   {"columns": columns, "rows": rows}, notes, missing)


def _imagenet_star_slopes(results: list[tuple[str, dict]], members=None, id_table=None) -> dict:
    from genshift.eval.slope import slope_table

    pop = get_population("imagenet-star-61")
    suite = next((s for s in pop.suites if any(r["suite"]["id"] == s for _, r in results)), pop.suites[0])
    found, outside = match_population(pop, results, suite, members)
    if len(found) < 2:
        raise BenchError(f"the ID/OOD slopes need results of at least 2 of the population's models on {suite}; "
                         f"found {len(found)}")
    fitted = [f.result for f in found.values()]
    ids, notes = None, []
    if id_table is not None:
        from genshift.eval.slope import id_accuracy

        ids, _ = id_accuracy(fitted, id_table)
        notes.append(f"ID axis: ImageNet-val top-1 from {id_table.path} at each eval's input size")
    table = slope_table(fitted, id_accuracy=ids)
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
    missing = [_missing_line(m, suite) for m in pop.members if m.paper not in found]
    report = _report("imagenet-star-slopes", rep, pop, suite, found, outside, [],
                     {"columns": list(rows[0]) if rows else ["shift"], "rows": rows}, notes, missing)
    report["id_axis"] = table["id_axis"] if ids is None else f"ImageNet-val top-1 ({id_table.path})"
    return report


def _report(name, rep, pop, suite, found, outside, cells, layout, notes, missing) -> dict:
    return {"table": name, "title": rep["title"], "paper": rep["paper"], "where": rep["where"], "population": pop.name,
            "suite": suite, "layout": layout, "cells": cells,
            "filled": [{"row": k, "id": f.result["model"]["id"], "weights": f.weights, "result": f.path}
                       for k, f in found.items()],
            "missing": missing, "outside_population": sorted(outside),
            "not_reproduced": rep.get("not_reproduced", {}), "notes": notes}


_BUILDERS = {"lance-table2": _lance_table2, "in-g-fig4": _in_g_fig4, "imagenet-star-slopes": _imagenet_star_slopes}


def reproduce(table: str, results: list[tuple[str, dict]], *, members: dict[str, str] | None = None,
              id_table=None) -> dict:
    """The report of ``table`` (one of ``TABLES``) from ``(path, result)`` pairs. ``members`` names the
    local weights of members without public weights; ``id_table`` (``genshift.eval.slope.read_id_table``)
    puts ImageNet-val top-1 on the slopes' x-axis."""
    if table not in _BUILDERS:
        raise unknown("paper table", table, TABLES)
    if id_table is not None and table != "imagenet-star-slopes":
        raise BenchError("--id-accuracy applies to imagenet-star-slopes only")
    kw = {"id_table": id_table} if id_table is not None else {}
    return _BUILDERS[table](results, members, **kw)
