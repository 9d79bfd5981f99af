"""The numbers behind the board and the pictures of them: ranks and rank intervals per family, ties, the ID/OOD fit
and its band, and charts in the units they claim (figures rendered and their axes checked)."""

import base64
import json

import numpy as np
import pandas as pd
import pytest

from genshift.leaderboard import aggregate
from genshift.leaderboard.ui import heatmap_figure, id_ood_figure
from tests.boardkit import app, board, fresh_caches, key_of, table, texts  # noqa: F401


class _Entry:
    """What the ranking reads of an entry: its record's per-image hits (and LANCE's pairing)."""

    def __init__(self, model_id, hits: dict, match=None):
        self.model_id = model_id
        self.record = {"correct": {c: {"images": "same", "n": len(h), "k": 1,
                                       "hits": base64.b64encode(np.packbits(np.asarray(h, bool)).tobytes()).decode()}
                                   for c, h in hits.items()}}
        if match is not None:
            self.record["correct"]["counterfactual"]["match"] = base64.b64encode(
                np.asarray(match, "<i4").tobytes()).decode()


def test_fit_band_matches_a_hand_computed_case():
    # x = .1 .2 .3, y = .1 .3 .2: slope .5, intercept .1, residuals -.05 .1 -.05, SSres .015, s² = .015 (n-2 = 1),
    # Sxx = .02; at x0 = .2: se = sqrt(.015/3) = .0707107, t(.975, 1) = 12.7062 -> half-width .898464;
    # at x0 = .3: se = sqrt(.015 (1/3 + .01/.02)) = .1118034 -> half-width 1.420598
    lo, hi = aggregate.fit_band([0.1, 0.2, 0.3], [0.1, 0.3, 0.2], [0.2, 0.3])
    assert lo == pytest.approx([0.2 - 0.898464, 0.25 - 1.420598], abs=1e-5)
    assert hi == pytest.approx([0.2 + 0.898464, 0.25 + 1.420598], abs=1e-5)
    assert np.isnan(aggregate.fit_band([0.1, 0.2], [0.1, 0.3], [0.2])[0]).all()  # 2 points: no band


def test_point_ranks_share_float_ties():
    assert aggregate.point_ranks([0.3, 0.1 + 0.2, 0.5, np.nan], higher=True)[:3].tolist() == [2, 2, 1]
    assert aggregate.point_ranks([0.3, 0.1 + 0.2, 0.5], higher=False).tolist() == [1, 1, 3]


def test_ranks_follow_each_familys_headline_metric():
    # LANCE: 3 source images, 5 counterfactuals; rank by Δacc@1 (higher = more robust), not by accuracy
    match = [0, 0, 1, 2, 2]
    models = {  # top-1 hits per row
        "robust-but-weak": {"original": [1, 0, 0], "counterfactual": [1, 1, 0, 0, 0]},    # Δ = 2/5 - 1/3
        "accurate-but-brittle": {"original": [1, 1, 1], "counterfactual": [1, 0, 1, 0, 0]},  # Δ = 2/5 - 1
        "middle": {"original": [1, 1, 0], "counterfactual": [1, 1, 0, 0, 0]},               # Δ = 2/5 - 2/3
    }
    entries = [_Entry(m, h, match) for m, h in models.items()]
    point, reps, higher = aggregate.headline_replicates(entries, family="lance", configs=[], n_boot=200)
    assert higher and point == pytest.approx([2 / 5 - 1 / 3, 2 / 5 - 1, 2 / 5 - 2 / 3]) and reps.shape == (200, 3)
    ranks = aggregate.rank_intervals(entries, family="lance", configs=[], n_boot=200)
    assert [ranks[m].rank for m in models] == [1, 3, 2]
    # the same Δ (and replicates) as the result's own metric for one model (genshift.eval.scoring)
    from genshift.eval.scoring import ScoringOptions, delta_acc_replicates, lance_pair_weights
    w = lance_pair_weights(3, ScoringOptions(n_boot=200, seed=0))
    one = delta_acc_replicates(np.array([[1], [0], [0]]), np.array([[1], [1], [0], [0], [0]]),
                               np.array(match), np.ones(3, bool), w)
    assert one.delta[0] == pytest.approx(point[0]) and np.allclose(one.delta_reps[:, 0], reps[:, 0])
    # IN-G: the records hold top-3 hits; rank by the top-3 failure rate, lower is better
    ing = {"fails-half": {"failures": [1, 1, 0, 0]}, "fails-quarter": {"failures": [1, 1, 1, 0]}}
    ranks = aggregate.rank_intervals([_Entry(m, h) for m, h in ing.items()], family="in_g", configs=["failures"],
                                     n_boot=200)
    assert ranks["fails-quarter"].rank == 1 and ranks["fails-half"].rank == 2
    # models scored on other images are never paired: no intervals
    other = _Entry("other", {"failures": [1, 0, 0, 0]})
    other.record["correct"]["failures"]["images"] = "other images"
    assert aggregate.rank_intervals([_Entry("a", ing["fails-half"]), other], family="in_g",
                                    configs=["failures"]) is None


def test_tied_models_share_a_rank_and_their_interval_spans_the_tie():
    same = {"failures": [1, 0, 1, 0] * 10}
    entries = [_Entry(m, same) for m in ("a", "b")] + [_Entry("worse", {"failures": [0, 0, 0, 0] * 10})]
    ranks = aggregate.rank_intervals(entries, family="in_g", configs=["failures"], n_boot=100)
    assert (ranks["a"].rank, ranks["a"].lo, ranks["a"].hi) == (1, 1, 2) == (ranks["b"].rank, ranks["b"].lo,
                                                                            ranks["b"].hi)
    assert (ranks["worse"].rank, ranks["worse"].lo, ranks["worse"].hi) == (3, 3, 3)


def test_the_id_ood_chart_is_in_percent_on_one_scale_with_labels_and_y_equals_x():
    """The issue's case: 8 models between 86% and 94% in-distribution whose shift accuracy follows slope ~1.9."""
    rng = np.random.default_rng(0)
    x = np.linspace(0.86, 0.94, 8)
    y = 1.92 * x - 1.2 + rng.normal(0, 0.01, 8)
    slope, intercept = np.polyfit(x, y, 1)
    fit = {s: {"slope": slope, "intercept": intercept, "r2": 0.95, "n": 8} for s in ("linear",)}
    fit["probit"] = {"slope": float("nan"), "intercept": float("nan"), "r2": float("nan"), "n": 8}
    models = [f"timm/m{i}.in1k" for i in range(8)]
    fig = id_ood_figure(x, y, models, fit, shift="snow", axis="reference")
    xr, yr = fig.layout.xaxis.range, fig.layout.yaxis.range
    assert 0 <= xr[0] < xr[1] <= 100 and tuple(xr) == tuple(yr)  # percent, one range for both axes
    assert fig.layout.yaxis.scaleanchor == "x" and fig.layout.yaxis.scaleratio == 1  # a slope reads as drawn
    names = [t.name for t in fig.data]
    points = fig.data[names.index("models")]
    assert list(points.text) == [m.split("/")[-1] for m in models] and "text" in points.mode  # labelled points
    ident = fig.data[names.index("y = x (no drop)")]
    assert list(ident.x) == list(ident.y) == list(xr)
    (band,) = [t for t in fig.data if "band" in (t.name or "")]
    assert np.nanmin(band.y) >= yr[0] and np.nanmax(band.y) <= yr[1] <= 100  # clipped: never -35% .. 135%
    line = next(t for t in fig.data if (t.name or "").startswith(f"linear fit: slope {slope:.2f}"))
    ok = ~np.isnan(np.asarray(line.y, float))
    drawn = np.polyfit(np.asarray(line.x)[ok], np.asarray(line.y, float)[ok], 1)[0]
    assert drawn == pytest.approx(slope)  # the drawn line has the slope its legend states


def test_the_heatmap_writes_percent_in_cells_on_a_fixed_scale_and_neutralises_text():
    view = pd.DataFrame({"model": ["<b>m</b>&x", "n"], "rank": [1.0, np.nan], "acc1/base": [0.5, 0.25],
                         "acc1/snow": [0.125, 0.75]})
    spec = heatmap_figure(view, ["base", "snow"]).data[0]
    assert spec.zmin == 0 and spec.zmax == 100 and spec.texttemplate == "%{z:.1f}"
    assert np.asarray(spec.z).tolist() == [[50.0, 12.5], [25.0, 75.0]]
    assert list(spec.y) == ["#1 ‹b›m‹/b›＆x", "(not ranked) n"]


def test_the_pages_id_ood_chart_and_id_accuracy_csv(tmp_path, capsys):
    from genshift.cli import main

    root = board(tmp_path / "s")
    csv = tmp_path / "results-imagenet.csv"
    csv.write_text("\ufeffmodel,img_size,top1,top1_err,top5\nresnet50.a1_in1k-v0,224,80.1,19.9,95\n"
                   "vit_base_patch16_224.augreg_in21k_ft_in1k-v1,224,81.2,18.8,96\ntie_a.in1k,224,70.0,30,90\n"
                   "tie_b.in1k,224,70.0,30,90\nconvnext_tiny.fb_in1k-v2,224,82.0,18,96\n")
    table_ = aggregate.read_id_accuracy(csv)
    matched, unmatched = aggregate.join_id_accuracy(["timm/tie_a.in1k", "hf-hub:timm/tie_b.in1k", "x/y"], table_)
    assert set(matched) == {"timm/tie_a.in1k", "hf-hub:timm/tie_b.in1k"} and unmatched == ["x/y"]
    at = app(root, trusted_keys=f"{key_of(root)}.pub", id_accuracy=csv,
             query={"tab": "ID/OOD", "x": "ImageNet-val top-1 (--id-accuracy)"})
    assert not at.exception
    assert any("5 of 10 models matched, 5 unmatched" in t for t in texts(at))
    chart = json.loads(next(el for el in at.get("plotly_chart") if el.proto.id.endswith("id_ood")).proto.spec)
    xs = chart["data"][0]["x"]
    xs = np.frombuffer(base64.b64decode(xs["bdata"]), dtype=xs["dtype"]).tolist() if isinstance(xs, dict) else xs
    assert sorted(xs) == pytest.approx([70, 70, 80.1, 81.2, 82])
    lay = chart["layout"]
    assert lay["xaxis"]["range"] == lay["yaxis"]["range"] and 0 <= lay["xaxis"]["range"][0] < lay["xaxis"]["range"][1] \
        <= 100
    er = table(at, "effective_robustness_linear")
    assert list(er["effective_robustness_linear"]) == sorted(er["effective_robustness_linear"], reverse=True)
    imp = table(at, "shift_impact").set_index("shift")
    results = [json.loads(p.read_text()) for p in root.glob("*/*/result.json")]
    fitted = [r for r in results if r["model"]["id"].split("/")[-1] in table_]
    for sh in ("shift_01", "shift_02"):
        drops = [r["metrics"]["imagenet_star"]["absolute_impact"][sh]["value"] for r in fitted]
        assert imp.loc[sh, "shift_impact"] == pytest.approx(100 * np.mean(drops)) and imp.loc[sh, "models"] == 5
    bad = tmp_path / "bad.csv"
    bad.write_text("model,top1\nresnet50,eighty\n")
    assert main(["leaderboard", "--results", str(root), "--id-accuracy", str(bad)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error:") and "bad.csv:2" in err and len(err.strip().splitlines()) == 1
    few = app(root, trusted_keys=f"{key_of(root)}.pub", query={"tab": "ID/OOD", "q": "tie"})
    assert any("Only 2 models" in w.value for w in few.warning)
