"""genshift.families: each metric family declared once; scoring, eval.yaml and the board read it."""

import math

import numpy as np
import pyarrow as pa
import pytest

from genshift.families import FAMILIES, get_family
from genshift.suites import SUITES, get_suite


def _table(labels, top1, k=10):
    """A predictions table whose top-1 is ``top1`` (other predictions: classes never the label)."""
    from genshift.eval.predictions import schema

    n = len(labels)
    rank = [0 if t == y else k for t, y in zip(top1, labels)]
    return pa.table({"image_id": [f"i{i:03d}" for i in range(n)], "label": labels, "keep": [True] * n,
                     "pair_id": [None] * n, "topk_idx": [[t] + [900 + j for j in range(k - 1)] for t in top1],
                     "topk_prob": [[0.5] + [0.01] * (k - 1)] * n,
                     "true_prob": [0.5 if r == 0 else 0.001 for r in rank], "true_rank": rank}, schema=schema(k))


def test_every_registered_suite_names_a_registered_family_with_a_declared_headline():
    for sid in SUITES:
        fam = get_family(get_suite(sid).metric_family)
        assert fam.headline_metric.key == fam.headline
    for name in FAMILIES:
        fam = get_family(name)
        assert len({m.key for m in fam.metrics}) == len(fam.metrics)
        assert len({m.label for m in fam.metrics}) == len(fam.metrics), "one name per number"
        assert all(m.unit in ("%", "pp") for m in fam.metrics)


def test_unknown_family_is_refused_with_close_matches():
    from genshift.errors import NotFoundError

    with pytest.raises(NotFoundError, match="imagenet_star"):
        get_family("imagenet-star")


def test_imagenet_star_columns_from_a_scored_result_match_a_hand_count():
    from genshift.eval.scoring import ScoringOptions, score

    labels = [1, 2, 3, 4]
    tables = {"base": _table(labels, [1, 2, 3, 4]),      # 4/4
              "snow": _table(labels, [1, 2, 0, 0]),      # 2/4
              "dusk": _table(labels, [1, 0, 0, 0])}      # 1/4
    metrics = score("imagenet_star", tables, ScoringOptions(reference_config="base", n_boot=50))
    result = {"metrics": metrics, "protocol": {"scoring": {"reference_config": "base"}}}
    cols = get_family("imagenet_star").columns(result)
    assert cols["mean_shift_acc1"] == pytest.approx((0.5 + 0.25) / 2)      # shifts only
    assert cols["mean_acc1"] == pytest.approx((1 + 0.5 + 0.25) / 3)        # base + shifts
    assert cols["impact/snow"] == pytest.approx(0.5) and cols["impact/dusk"] == pytest.approx(0.75)
    assert cols["model_mean_impact"] == pytest.approx(0.625)
    assert cols["model_mean_impact_lo"] <= 0.625 <= cols["model_mean_impact_hi"]
    assert get_family("imagenet_star").rank_configs(["base", "dusk", "snow"], "base") == ["dusk", "snow"]


def test_in_g_outcomes_come_from_the_declaration():
    from genshift.eval.scoring import ScoringOptions, score

    labels = [1, 2, 3, 4]
    metrics = score("in_g", {"rn": _table(labels, [1, 0, 0, 0])}, ScoringOptions(n_boot=20))
    cols = get_family("in_g").columns({"metrics": metrics, "protocol": {"scoring": {}}})
    assert cols["top1_error"] == pytest.approx(0.75) and cols["top3_failure_rate"] == pytest.approx(0.75)
    assert get_family("in_g").headline_metric.higher_is_better is False


def test_eval_yaml_tasks_follow_the_declaration():
    assert [t.id for t in get_family("lance").tasks(["original", "counterfactual"])] == ["acc1_edited", "delta_acc1"]
    with pytest.raises(ValueError, match="counterfactual"):
        get_family("lance").tasks(["original"])
    assert [t.column for t in get_family("accuracy").tasks(["b", "a"])] == ["mean_acc1", "acc1/a", "acc1/b"]
    cols = get_family("accuracy").columns({"metrics": {"configs": {"a": {"acc1": None, "acc5": None}}}})
    assert math.isnan(cols["mean_acc1"]) and np.isnan(cols["acc1/a"])
