"""Metric families: each suite family declares its metrics once, and everything reads the declaration.

A :class:`Family` (``imagenet_star``, ``lance``, ``in_g`` or plain ``accuracy``) holds its metrics, its headline,
the board's per-image rank outcome, whether it scores shifts against a reference config, and its scorer, extra
outcomes and analysis as lazy ``"module:function"`` targets (the core never imports the eval layer). No other
module branches on a family's name. Units: ``"%"`` is a fraction shown in percent; ``"pp"`` a difference of two
fractions shown in percentage points.
"""

from __future__ import annotations

import math
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from genshift.registry import Registry


@dataclass(frozen=True)
class Metric:
    """One number a result of the family carries."""

    key: str                 # the board's column (per-config metrics: "<key>/<config>")
    label: str               # for people: tables, charts, CSV headers, eval.yaml
    unit: str                # "%" or "pp"
    higher_is_better: bool
    source: str              # the paper and where it defines the number
    per: str | None = None   # "config" or "edit type": one value per config / edit type, column "<key>/<name>"

    def column(self, name: str | None = None) -> str:
        return f"{self.key}/{name}" if self.per else self.key


@dataclass(frozen=True)
class Task:
    """A task of a suite's Hub ``eval.yaml``: a metric and the dataset config it is scored on."""

    id: str       # the task id in eval.yaml and in model repos' .eval_results entries
    config: str   # the dataset config it is scored on
    column: str   # the board's column holding its value (a fraction)
    label: str    # for people


@dataclass(frozen=True)
class Family:
    """A metric family (see the module docstring)."""

    name: str
    title: str
    paper: str
    metrics: tuple[Metric, ...]
    headline: str                    # key of the ranked metric
    scorer: str | None = None        # "module:function(configs, replicates, options) -> dict": the metrics block
    block: str | None = None         # that block's key in result["metrics"]
    outcomes: str | None = None      # "module:function(config) -> {name: (n,) array}": more per-image outcomes
    analysis: str | None = None      # "module:function(suite, tables, seed) -> {name: ...} | None": result["analysis"]
    reference: bool = False          # scores shifts against a reference config (default "base")
    rank_k: int = 1                  # the board's per-image rank outcome: true class in the top k ...
    rank_misses: bool = False        # ... or not in the top k (a failure rate: lower is better)
    rank_paired_delta: bool = False  # rank by the paired Δacc@k of counterfactuals vs originals (LANCE)
    extra_columns: Callable[[Mapping], dict] | None = None  # the family's own numbers off a result
    suite_tasks: Callable[[list[str], str | None], list[Task]] | None = None  # eval.yaml tasks

    def metric(self, key: str) -> Metric:
        for m in self.metrics:
            if m.key == key:
                return m
        raise KeyError(f"metric family {self.name} has no metric {key!r}; it has "
                       f"{', '.join(m.key for m in self.metrics)}")

    @property
    def headline_metric(self) -> Metric:
        return self.metric(self.headline)

    def rank_configs(self, configs: list[str], reference: str | None = None) -> list[str]:
        """The configs the board's rank outcome averages over."""
        return [c for c in configs if not (self.reference and c == (reference or "base"))]

    def columns(self, result: Mapping) -> dict[str, float]:
        """Every number of the family in a result, by column (fractions, NaN where undefined): per-config
        acc@1/acc@5, ``mean_acc1`` and the family's own (with ``<key>_lo``/``<key>_hi`` where there is an interval)."""
        configs = result["metrics"]["configs"]
        cols = {}
        for c, m in configs.items():
            cols[f"acc1/{c}"], cols[f"acc5/{c}"] = value(m.get("acc1")), value(m.get("acc5"))
        cols["mean_acc1"] = _mean(cols[f"acc1/{c}"] for c in configs)
        if self.extra_columns is not None:
            cols.update(self.extra_columns(result))
        return cols

    def tasks(self, configs: list[str], reference: str | None = None) -> list[Task]:
        """The Hub ``eval.yaml`` tasks of a suite with these configs (ValueError if they lack the headline's)."""
        configs = sorted(configs)
        if self.suite_tasks is not None:
            return self.suite_tasks(configs, reference)
        return [Task("mean_acc1", configs[0], "mean_acc1", self.metric("mean_acc1").label),
                *(Task(f"acc1_{c}", c, f"acc1/{c}", f"acc@1 on {c}") for c in configs)]

    def resolve(self, target: str | None):
        """The function a lazy ``"module:function"`` target names (None for None)."""
        return None if target is None else pkgutil.resolve_name(target)


def value(metric: Mapping | None) -> float:
    """A stored metric's value (``{"value": v, "ci": [lo, hi], "n": n}``), NaN when absent or undefined."""
    return math.nan if not metric or metric.get("value") is None else float(metric["value"])


def interval(key: str, metric: Mapping | None) -> dict[str, float]:
    """``{key, key_lo, key_hi}`` of a stored metric (NaN where absent)."""
    ci = (metric or {}).get("ci") or (math.nan, math.nan)
    return {key: value(metric), f"{key}_lo": float(ci[0]), f"{key}_hi": float(ci[1])}


def _mean(values) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


ACC1 = Metric("acc1", "acc@1", "%", True, "top-1 accuracy; LANCE Eq. 3's acc@k at k = 1", per="config")
ACC5 = Metric("acc5", "acc@5", "%", True, "top-5 accuracy; LANCE Eq. 3's acc@k at k = 5", per="config")
MEAN_ACC1 = Metric("mean_acc1", "mean acc@1 (all configs)", "%", True, "acc@1 averaged over every config scored")


def _star_columns(result: Mapping) -> dict:
    m = result["metrics"]
    star = m.get("imagenet_star", {})
    ref = result["protocol"]["scoring"].get("reference_config") or "base"
    cols = {"mean_shift_acc1": _mean(value(cm.get("acc1")) for c, cm in m["configs"].items() if c != ref)}
    cols.update(interval("model_mean_impact", star.get("model_mean_impact", star.get("mean_absolute_impact"))))
    for s, im in star.get("absolute_impact", {}).items():
        cols[f"impact/{s}"] = value(im)
    return cols


def _star_tasks(configs: list[str], reference: str | None) -> list[Task]:
    shifts = [c for c in configs if c != (reference or "base")]
    if not shifts:
        raise ValueError("an ImageNet* suite needs at least one shift config besides its reference")
    return [Task("mean_shift_acc1", shifts[0], "mean_shift_acc1", "mean shift acc@1"),
            *(Task(f"acc1_{s}", s, f"acc1/{s}", f"acc@1 on {s}") for s in shifts)]


IMAGENET_STAR = Family(
    name="imagenet_star", title="ImageNet*", paper="Vendrow et al. 2023, Dataset Interfaces",
    metrics=(
        ACC1, ACC5,
        Metric("mean_shift_acc1", "mean shift acc@1", "%", True,
               "Vendrow et al. 2023: acc@1 on each shift, averaged over the shifts (the reference config excluded)"),
        Metric("mean_acc1", "mean acc@1 (base + shifts)", "%", True, "acc@1 averaged over every config scored"),
        Metric("impact", "absolute impact", "pp", False,
               "Vendrow et al. 2023: the drop acc(reference) - acc(shift)", per="config"),
        Metric("model_mean_impact", "model mean impact", "pp", False,
               "this model's absolute impact averaged over its shifts")),
    headline="mean_shift_acc1", scorer="genshift.eval.scoring:imagenet_star_block", block="imagenet_star",
    reference=True, extra_columns=_star_columns, suite_tasks=_star_tasks)


def _lance_columns(result: Mapping) -> dict:
    lance = result["metrics"].get("lance", {})
    t = lance.get("headline_T", "originals_with_counterfactual")
    cols = {}
    for k in (1, 5):
        cols.update(interval(f"delta_acc{k}", lance.get(f"delta_acc{k}", {}).get(t)))
    cols["mean_delta_p"] = value(lance.get("delta_p"))
    for edit_type, dp in lance.get("delta_p_by_edit_type", {}).items():
        cols[f"delta_p/{edit_type}"] = value(dp)
    return cols


def _lance_tasks(configs: list[str], reference: str | None) -> list[Task]:
    if "counterfactual" not in configs:
        raise ValueError("a LANCE suite needs a 'counterfactual' config")
    return [Task("acc1_edited", "counterfactual", "acc1/counterfactual", "acc@1 on edited images"),
            Task("delta_acc1", "counterfactual", "delta_acc1", "Δacc@1 (edited − original)")]


LANCE = Family(
    name="lance", title="LANCE", paper="Prabhu et al. 2023, LANCE",
    metrics=(
        ACC1, ACC5, MEAN_ACC1,
        Metric("delta_acc1", "Δacc@1", "pp", True,
               "Prabhu et al. 2023, Eq. 3 at k = 1 (T: originals with a counterfactual)"),
        Metric("delta_acc5", "Δacc@5", "pp", True, "Prabhu et al. 2023, Eq. 3 at k = 5"),
        Metric("mean_delta_p", "mean Δp", "pp", False,
               "Prabhu et al. 2023, §4: Δp(y_GT|x) = |p(y_GT|x) - p(y_GT|x')|, averaged over the pairs"),
        Metric("delta_p", "mean Δp of an edit type", "pp", False, "Prabhu et al. 2023, Fig. 3: mean Δp per edit type",
               per="edit type")),
    headline="delta_acc1", scorer="genshift.eval.scoring:lance_block", block="lance",
    analysis="genshift.eval.diagnose:result_clusters", rank_paired_delta=True,
    extra_columns=_lance_columns, suite_tasks=_lance_tasks)


def _in_g_columns(result: Mapping) -> dict:
    rates = result["metrics"].get("in_g", {})
    cols = {}
    for c, per in rates.items():
        for k, v in per.items():
            cols.update(interval(k if len(rates) == 1 else f"{k}/{c}", v))
    return cols


def _in_g_tasks(configs: list[str], reference: str | None) -> list[Task]:
    if len(configs) == 1:
        return [Task("top3_failure_rate", configs[0], "top3_failure_rate", "top-3 failure rate")]
    return [Task(f"top3_failure_rate_{c}", c, f"top3_failure_rate/{c}", f"top-3 failure rate on {c}") for c in configs]


IN_G = Family(
    name="in_g", title="IN-G", paper="Wiles et al. 2022, Discovering Bugs in Vision Models",
    metrics=(
        ACC1, ACC5, MEAN_ACC1,
        Metric("top1_error", "top-1 error", "%", False, "1 - acc@1"),
        Metric("top3_failure_rate", "top-3 failure rate", "%", False,
               "Wiles et al., Fig. 4: failures are counted when the top-3 predictions do not include the true label"),
        Metric("parent_failure_rate", "WordNet-parent failure rate", "%", False,
               "Wiles et al., §3: any top-3 prediction outside the true label's WordNet parent")),
    headline="top3_failure_rate", scorer="genshift.eval.scoring:in_g_block", block="in_g",
    outcomes="genshift.eval.scoring:in_g_outcomes", rank_k=3, rank_misses=True,
    extra_columns=_in_g_columns, suite_tasks=_in_g_tasks)


ACCURACY = Family(
    name="accuracy", title="accuracy", paper="",
    metrics=(ACC1, ACC5, MEAN_ACC1),
    headline="mean_acc1")


FAMILIES: Registry[Family] = Registry("metric family")
for _family in (IMAGENET_STAR, LANCE, IN_G, ACCURACY):
    FAMILIES.register(_family.name, _family)
FAMILIES.freeze()


def get_family(name: str) -> Family:
    """The registered family ``name`` (unknown names: an error listing close matches)."""
    return FAMILIES.get(name)
