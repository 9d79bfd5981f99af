"""Every metric on hand-computed cases and against naive loops written from the definitions."""

import numpy as np
import pytest
from scipy.stats import norm

from genshift.errors import BenchError
from genshift.eval import bootstrap, metrics
from genshift.eval.predictions import PredictionBlock, schema
from genshift.eval.scoring import ScoringOptions, score


def test_acc_at_k_hand_case_and_naive_loop():
    y = [3, 1, 4, 1]
    topk = [[3, 0, 2], [0, 1, 2], [5, 6, 7], [9, 8, 1]]
    assert metrics.acc_at_k(y, topk, k=1) == 0.25
    assert metrics.acc_at_k(y, topk, k=2) == 0.5
    assert metrics.acc_at_k(y, topk, k=3) == 0.75
    rng = np.random.default_rng(0)
    y = rng.integers(0, 20, 500)
    topk = np.stack([rng.permutation(20)[:5] for _ in range(500)])
    for k in range(1, 6):
        naive = sum(1 for i in range(500) if y[i] in topk[i, :k]) / 500
        assert metrics.acc_at_k(y, topk, k=k) == pytest.approx(naive)
    with pytest.raises(ValueError, match="k=6"):
        metrics.acc_at_k(y, topk, k=6)
    assert np.isnan(metrics.acc_at_k(np.zeros(0, int), np.zeros((0, 5), int), k=1))


def test_delta_acc_eq3_and_delta_p():
    # T: 4 originals, 3 right at top-1; T': 5 counterfactuals, 2 right -> 2/5 - 3/4 = -0.35
    y_o, top_o = [1, 2, 3, 4], [[1], [2], [3], [0]]
    y_c, top_c = [1, 1, 2, 3, 4], [[1], [0], [0], [3], [0]]
    assert metrics.delta_acc_at_k(y_o, top_o, y_c, top_c, k=1) == pytest.approx(-0.35)
    assert metrics.delta_p([0.9, 0.1, 0.5], [0.6, 0.4, 0.5]).tolist() == pytest.approx([0.3, 0.3, 0.0])
    assert metrics.pair_up(["x", "y"], ["y", "y", "x"]).tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match="twice"):
        metrics.pair_up(["x", "x"], ["x"])


def test_absolute_impact_sign():
    assert metrics.absolute_impact(0.80, 0.60) == pytest.approx(0.20)
    assert metrics.absolute_impact(0.60, 0.80) == pytest.approx(-0.20)


def test_in_g_failures_hand_made():
    from genshift import imagenet
    crayfish, dungeness, king_crab = 124, 118, 121
    tench, goldfish, persian, lynx = 0, 1, 283, 287
    fly, bee, ladybug = imagenet.index_of("n02190166"), imagenet.index_of("n02206856"), imagenet.index_of("n02165456")
    y = [crayfish, crayfish, fly, fly, persian]
    top3 = [
        [dungeness, tench, goldfish],   # a crab is under crustacean: not a failure
        [tench, goldfish, lynx],        # nothing under crustacean: failure
        [bee, tench, goldfish],         # bee and fly are both insects: not a failure
        [ladybug, bee, tench],          # not a failure (insects), though top-1 and top-3 miss
        [lynx, tench, goldfish],        # lynx is a wild cat, not a domestic animal: failure
    ]
    assert metrics.parent_failures(y, top3).tolist() == [False, True, False, False, True]
    assert metrics.parent_failure_rate(y, top3) == pytest.approx(0.4)
    assert metrics.top1_error(y, top3) == pytest.approx(1.0)
    assert metrics.top3_failure_rate(y, top3) == pytest.approx(1.0)
    assert imagenet.is_under(king_crab, imagenet.get_class(crayfish).parent)


def test_id_ood_fit_linear_and_probit_by_hand():
    x, y = [0.6, 0.7, 0.8], [0.4, 0.45, 0.6]
    fit = metrics.id_ood_fit(x, y, scale="linear")
    # slope = cov/var = (0.1*0.1 ... ) computed by hand: xbar=.7, ybar=.48333; Sxy=0.02, Sxx=0.02 -> 1.0
    assert fit["slope"] == pytest.approx(1.0)
    assert fit["intercept"] == pytest.approx(0.48333333 - 0.7)
    resid = [y[i] - (x[i] + fit["intercept"]) for i in range(3)]
    assert fit["effective_robustness"] == pytest.approx(resid)
    assert fit["r2"] == pytest.approx(1 - sum(r * r for r in resid) / sum((v - np.mean(y)) ** 2 for v in y))
    p = metrics.id_ood_fit(x, y, scale="probit")
    gx, gy = norm.ppf(x), norm.ppf(y)
    slope, intercept = np.polyfit(gx, gy, 1)
    assert p["slope"] == pytest.approx(slope) and p["intercept"] == pytest.approx(intercept)
    assert p["effective_robustness"] == pytest.approx(list(np.array(y) - norm.cdf(slope * gx + intercept)))
    one = metrics.id_ood_fit([0.5], [0.4])
    assert np.isnan(one["slope"]) and one["n"] == 1


def test_bootstrap_is_seeded_paired_and_matches_resampling():
    rng = np.random.default_rng(3)
    a = rng.random(400) < 0.7
    b = a.copy()
    b[:40] = ~b[:40]
    r1 = bootstrap.paired_mean_replicates(np.stack([a, b], 1), n_boot=300, key="cfg")
    r2 = bootstrap.paired_mean_replicates(np.stack([a], 1), n_boot=300, key="cfg")
    assert np.array_equal(r1[:, 0], r2[:, 0])  # adding a model does not change another's replicates
    diff = r1[:, 0] - r1[:, 1]
    assert diff.std() < (r1[:, 0].std() ** 2 + r1[:, 1].std() ** 2) ** 0.5 * 0.8  # pairing shrinks the spread
    # the moments of the textbook bootstrap of a mean: E = p, sd = sqrt(p(1-p)/n)
    big = rng.random(5000) < 0.8
    r = bootstrap.paired_mean_replicates(big, n_boot=4000, key="x")[:, 0]
    p = big.mean()
    assert r.mean() == pytest.approx(p, abs=0.001) and r.std() == pytest.approx((p * (1 - p) / 5000) ** 0.5, rel=0.06)
    assert np.array_equal(r, bootstrap.paired_mean_replicates(big, n_boot=4000, key="x")[:, 0])
    assert not np.array_equal(r, bootstrap.paired_mean_replicates(big, n_boot=4000, key="y")[:, 0])
    lo, hi = bootstrap.percentile_ci(r)
    assert lo < p < hi


@pytest.mark.parametrize("n", [1, 7, 63, 100, 2047, 2048, 5003])
def test_resamples_are_bootstrap_draws_and_both_routes_agree(n):
    """Every replicate resamples exactly n images; the FFT route equals the explicit count matrix."""
    r = bootstrap.resampling(n, n_boot=500, seed=4, key="cfg")
    w = r.matrix()
    assert w.shape == (500, n) and (w.sum(axis=1) == n).all() and (w >= 0).all()
    rng = np.random.default_rng(n)
    hits = rng.random((n, 3)) < 0.6
    assert np.array_equal(r.sums(hits), w.astype(np.float64) @ hits)
    cont = rng.random((n, 2))
    assert r.sums(cont) == pytest.approx(w.astype(np.float64) @ cont, rel=1e-12, abs=1e-9)
    if n >= 64:  # rotations of a pool are distinct resamples, not copies
        assert len({row.tobytes() for row in w}) == 500


def test_two_models_differing_on_3_of_1000_images_have_paired_intervals():
    """Issue case: A and B agree on 997 of 1000 images, B is right on 3 more.

    By hand: the difference of replicates is (resample count of those 3 images) / 1000, and that
    count is Binomial(1000, 3/1000): P(0) = 0.997^1000 = 0.0496 > 2.5 %, P(<= 6) = 0.966,
    P(<= 7) = 0.988, so the 95 % interval of the difference is [0, 0.7] pp around 0.3 pp; the
    replicates of A and B correlate at about 1 - 0.17^2 / (2 * 1.3^2) = 0.99.
    """
    from genshift.eval.scoring import outcome_replicates

    rng = np.random.default_rng(0)
    a = rng.random(1000) < 0.8
    b = a.copy()
    b[np.flatnonzero(~a)[:3]] = True
    o = ScoringOptions()
    ra = outcome_replicates("in_the_snow", {"acc1": a}, o)["acc1"]  # each model scored on its own
    rb = outcome_replicates("in_the_snow", {"acc1": b}, o)["acc1"]
    assert np.corrcoef(ra, rb)[0, 1] > 0.98
    diff = rb - ra
    assert (diff >= 0).all() and diff.mean() == pytest.approx(0.003, abs=0.0003)
    lo, hi = bootstrap.percentile_ci(diff)
    assert lo == 0.0 and 0.006 <= hi <= 0.0075
    # the same draws as the leaderboard's rank intervals (all models in one matrix)
    both = bootstrap.paired_mean_replicates(np.stack([a, b], 1), key="in_the_snow")
    assert np.array_equal(both[:, 0], ra) and np.array_equal(both[:, 1], rb)
    # and the intervals stored in each result are the percentiles of exactly these replicates
    t = _table([{"id": f"i{i:04d}", "y": 1, "top": [1] if hit else [2], "p": 0.5} for i, hit in enumerate(a)])
    stored = score("accuracy", {"in_the_snow": t}, o)["configs"]["in_the_snow"]["acc1"]
    assert stored["ci"] == list(bootstrap.percentile_ci(ra))


def _table(rows):
    sch = schema(5, ("edit_type", "edit_type_fine"))
    n = len(rows)
    block = PredictionBlock(
        image_id=[r["id"] for r in rows], label=np.array([r["y"] for r in rows]),
        keep=np.array([r.get("keep", True) for r in rows]), pair_id=[r.get("pair") for r in rows],
        topk_idx=np.array([r["top"] + [900, 901, 902, 903, 904][len(r["top"]):] for r in rows]),
        topk_prob=np.full((n, 5), 0.1, np.float32), true_prob=np.array([r["p"] for r in rows], np.float32),
        true_rank=np.array([r["top"].index(r["y"]) if r["y"] in r["top"] else 50 for r in rows]),
        carried={"edit_type": [r.get("edit") for r in rows], "edit_type_fine": [r.get("fine") for r in rows]},
    )
    return block.to_table(sch)


def test_imagenet_star_scoring_by_hand():
    base = _table([{"id": f"b{i}", "y": 1, "top": [1] if i < 3 else [2], "p": 0.5} for i in range(4)])
    snow = _table([{"id": f"s{i}", "y": 1, "top": [1] if i < 1 else [2], "p": 0.5, "keep": i != 3} for i in range(4)])
    out = score("imagenet_star", {"base": base, "in_the_snow": snow}, ScoringOptions(reference_config="base"))
    assert out["configs"]["base"]["acc1"]["value"] == pytest.approx(0.75)
    assert out["configs"]["in_the_snow"]["acc1"]["value"] == pytest.approx(1 / 3)  # keep filter: 3 rows
    assert out["configs"]["in_the_snow"]["n_scored"] == 3 and out["configs"]["in_the_snow"]["n_total"] == 4
    imp = out["imagenet_star"]["absolute_impact"]["in_the_snow"]
    assert imp["value"] == pytest.approx(0.75 - 1 / 3)
    assert imp["ci"][0] <= imp["value"] <= imp["ci"][1]
    nofilter = score("imagenet_star", {"base": base, "in_the_snow": snow}, ScoringOptions(filter=False))
    assert nofilter["configs"]["in_the_snow"]["acc1"]["value"] == pytest.approx(0.25)
    given = score("imagenet_star", {"base": base, "in_the_snow": snow}, ScoringOptions(reference_accuracy=0.9))
    assert given["imagenet_star"]["absolute_impact"]["in_the_snow"]["value"] == pytest.approx(0.9 - 1 / 3)


def test_lance_scoring_by_hand():
    orig = _table([
        {"id": "o1", "y": 5, "top": [5], "p": 0.9, "pair": "A"},
        {"id": "o2", "y": 5, "top": [5], "p": 0.8, "pair": "B"},
        {"id": "o3", "y": 6, "top": [1], "p": 0.1, "pair": "C"},  # no counterfactual survived
    ])
    cf = _table([
        {"id": "c1", "y": 5, "top": [1, 5], "p": 0.3, "pair": "A", "edit": "background"},
        {"id": "c2", "y": 5, "top": [5], "p": 0.7, "pair": "A", "edit": "domain"},
        {"id": "c3", "y": 5, "top": [2], "p": 0.2, "pair": "B", "edit": "background"},
    ])
    out = score("lance", {"original": orig, "counterfactual": cf}, ScoringOptions(n_boot=200))["lance"]
    # T' acc@1 = 1/3; T(all) = 2/3; T(with cf) = 2/2
    assert out["delta_acc1"]["all_originals"]["value"] == pytest.approx(1 / 3 - 2 / 3)
    assert out["delta_acc1"]["originals_with_counterfactual"]["value"] == pytest.approx(1 / 3 - 1.0)
    assert out["delta_acc5"]["originals_with_counterfactual"]["value"] == pytest.approx(2 / 3 - 1.0)
    # Δp: |0.9-0.3|, |0.9-0.7|, |0.8-0.2| -> mean 0.4667
    assert out["delta_p"]["value"] == pytest.approx((0.6 + 0.2 + 0.6) / 3, abs=1e-6)
    assert out["delta_p_by_edit_type"]["background"]["value"] == pytest.approx(0.6, abs=1e-6)
    assert out["delta_p_by_edit_type"]["domain"]["value"] == pytest.approx(0.2, abs=1e-6)
    assert out["n_pairs"] == 3 and out["n_originals_with_counterfactual"] == 2
    assert out["headline_T"] == "originals_with_counterfactual"
    orphan = _table([{"id": "c9", "y": 5, "top": [5], "p": 0.5, "pair": "Z", "edit": "object"}])
    with pytest.raises(ValueError, match="counterfactual with pair_id 'Z' has no original"):
        score("lance", {"original": orig, "counterfactual": orphan}, ScoringOptions(n_boot=10))


def test_lance_table2_rows_and_paper_edit_types_by_hand():
    """Table 2's three rows from one result, and Fig. 3's five edit types (weather within background)."""
    orig = _table([
        {"id": "o1", "y": 5, "top": [5], "p": 0.9, "pair": "A"},
        {"id": "o2", "y": 5, "top": [5], "p": 0.8, "pair": "B"},
        {"id": "o3", "y": 6, "top": [1], "p": 0.1, "pair": "C"},  # no counterfactual survived
    ])
    rec = _table([
        {"id": "r1", "y": 5, "top": [5], "p": 0.9, "pair": "A"},
        {"id": "r2", "y": 5, "top": [1, 5], "p": 0.4, "pair": "B"},   # top-5 hit only
        {"id": "r3", "y": 6, "top": [6], "p": 0.7, "pair": "C"},
    ])
    old_style = _table([  # an older suite: weather is its own edit_type
        {"id": "c1", "y": 5, "top": [1, 5], "p": 0.4, "pair": "A", "edit": "background"},
        {"id": "c2", "y": 5, "top": [5], "p": 0.7, "pair": "A", "edit": "domain"},
        {"id": "c3", "y": 5, "top": [2], "p": 0.2, "pair": "B", "edit": "weather"},
    ])
    out = score("lance", {"original": orig, "reconstruction": rec, "counterfactual": old_style},
                ScoringOptions(n_boot=200))["lance"]
    t, every = "originals_with_counterfactual", "all_originals"
    # Original row: T = {o1, o2}: acc@1 1, acc@5 1. Reconstructed: {r1, r2}: acc@1 1/2 (Δ -1/2), acc@5 1 (Δ 0)
    assert out["acc1_T"][t]["value"] == 1.0 and out["acc1_reconstruction"][t]["value"] == 0.5
    assert out["delta_acc1_reconstruction"][t]["value"] == -0.5 and out["delta_acc5_reconstruction"][t]["value"] == 0
    assert out["acc1_reconstruction"][t]["n"] == 2
    # over all originals: {r1, r2, r3} acc@1 2/3 vs {o1, o2, o3} 2/3 -> Δ 0
    assert out["acc1_reconstruction"][every]["value"] == pytest.approx(2 / 3)
    assert out["delta_acc1_reconstruction"][every]["value"] == pytest.approx(0)
    # LANCE row: T' acc@1 1/3, Δ = 1/3 - 1
    assert out["acc1_counterfactual"]["value"] == pytest.approx(1 / 3)
    assert out["delta_acc1"][t]["value"] == pytest.approx(1 / 3 - 1)
    ci = out["delta_acc1_reconstruction"][t]["ci"]
    assert ci[0] <= -0.5 + 1e-12 and ci[1] <= 0 + 1e-12
    # Δp: background |0.9-0.4| = 0.5, domain 0.2, weather |0.8-0.2| = 0.6 -> background (5 types) = 0.55
    by_type = out["delta_p_by_edit_type"]
    assert set(by_type) == {"background", "domain"}
    assert by_type["background"]["value"] == pytest.approx(0.55, abs=1e-6) and by_type["background"]["n"] == 2
    assert out["delta_p"]["value"] == pytest.approx((0.5 + 0.2 + 0.6) / 3, abs=1e-6)
    six = score("lance", {"original": orig, "counterfactual": old_style},
                ScoringOptions(n_boot=50, fold_weather=False))["lance"]
    assert six["delta_p_by_edit_type"]["weather"]["value"] == pytest.approx(0.6, abs=1e-6)
    assert "acc1_reconstruction" not in six and "Reconstructed row is not computed" in six["note"]
    new_style = _table([  # a current suite: the 5-way label, and the finer one as its own column
        {"id": "c1", "y": 5, "top": [1, 5], "p": 0.4, "pair": "A", "edit": "background", "fine": "background"},
        {"id": "c2", "y": 5, "top": [5], "p": 0.7, "pair": "A", "edit": "domain", "fine": "domain"},
        {"id": "c3", "y": 5, "top": [2], "p": 0.2, "pair": "B", "edit": "background", "fine": "weather"},
    ])
    new = score("lance", {"original": orig, "counterfactual": new_style}, ScoringOptions(n_boot=50))["lance"]
    assert new["delta_p_by_edit_type"] == score("lance", {"original": orig, "counterfactual": old_style},
                                                ScoringOptions(n_boot=50))["lance"]["delta_p_by_edit_type"]
    assert new["delta_p_by_edit_type_fine"]["weather"]["value"] == pytest.approx(0.6, abs=1e-6)
    stray = _table([{"id": "r9", "y": 5, "top": [5], "p": 0.5, "pair": "Z"}])
    with pytest.raises(ValueError, match="reconstruction with pair_id 'Z' has no original"):
        score("lance", {"original": orig, "reconstruction": stray, "counterfactual": old_style},
              ScoringOptions(n_boot=10))


def test_in_g_scoring_uses_the_parent_rule():
    crayfish, dungeness, tench = 124, 118, 0
    t = _table([{"id": "a", "y": crayfish, "top": [dungeness, tench, 1], "p": 0.0},
                {"id": "b", "y": crayfish, "top": [tench, 1, 2], "p": 0.0}])
    out = score("in_g", {"generated": t}, ScoringOptions(n_boot=50))["in_g"]["generated"]
    assert out["top1_error"]["value"] == 1.0 and out["top3_failure_rate"]["value"] == 1.0
    assert out["parent_failure_rate"]["value"] == 0.5


def test_empty_config_gives_nulls():
    t = _table([{"id": "a", "y": 1, "top": [1], "p": 1.0, "keep": False}])
    out = score("accuracy", {"x": t}, ScoringOptions(n_boot=10))
    assert out["configs"]["x"]["acc1"] == {"value": None, "ci": None, "n": 0}


@pytest.mark.parametrize("module, at_least", [("genshift.eval.metrics", 9), ("genshift.eval.scoring", 3),
                                               ("genshift.eval.slope", 1),
                                               ("genshift.builders.discover", 1),
                                               ("genshift.builders.lance_perturb", 2)])
def test_doctests(module, at_least):
    """The hand-computed cases in the docstrings (metric equations, Δacc replicates, BH, word diff)."""
    import doctest
    import importlib

    failed, tried = doctest.testmod(importlib.import_module(module))
    assert tried >= at_least and failed == 0


def _star_result(model, base, shifts):
    """A minimal schema-valid ImageNet* result record: acc@1 on base and the shifts, drops as scored."""
    from tests.resultkit import fake_result

    configs = {"base": {"acc1": {"value": base}}, **{s: {"acc1": {"value": a}} for s, a in shifts.items()}}
    impact = {s: {"value": base - a, "ci": None, "n": 10} for s, a in shifts.items()}
    return fake_result(model, list(configs), {"configs": configs, "imagenet_star": {
        "reference": "config base", "absolute_impact": impact}}, suite_id="imagenet-star")


def test_shift_impact_is_a_shifts_drop_averaged_over_models_by_hand(tmp_path, capsys):
    """Per shift, the mean over models of acc(base) - acc(shift), t interval over models; not a model's mean.

    By hand: drops on snow 0.1, 0.2, 0.3 -> 0.2, sd 0.1, t(0.975, 2) = 4.3027, half-width
    4.3027 * 0.1 / sqrt(3) = 0.2484; dusk 0.3, 0.0, 0.3 -> 0.2, sd sqrt(0.03), half 0.4303.
    The models' own means over shifts (model_mean_impact) are 0.2, 0.1, 0.3 instead.
    """
    import json

    from genshift.cli import main
    from genshift.eval.slope import shift_impact, shift_impact_table

    results = [_star_result("m0", 0.9, {"in_the_snow": 0.8, "at_dusk": 0.6}),
               _star_result("m1", 0.8, {"in_the_snow": 0.6, "at_dusk": 0.8}),
               _star_result("m2", 0.7, {"in_the_snow": 0.4, "at_dusk": 0.4})]
    table = shift_impact_table(results)
    assert table["in_the_snow"]["value"] == pytest.approx(0.2) and table["in_the_snow"]["n"] == 3
    assert table["in_the_snow"]["ci"] == pytest.approx([0.2 - 0.2484, 0.2 + 0.2484], abs=1e-4)
    assert table["at_dusk"]["value"] == pytest.approx(0.2)
    assert table["at_dusk"]["ci"] == pytest.approx([0.2 - 0.4303, 0.2 + 0.4303], abs=1e-4)
    assert shift_impact([0.25]) == {"value": 0.25, "ci": None, "n": 1}
    assert shift_impact([None, float("nan")]) == {"value": None, "ci": None, "n": 0}
    paths = []
    for r in results:
        p = tmp_path / f"{r['model']['id'].replace('/', '--')}.json"
        p.write_text(json.dumps(r))
        paths.append(str(p))
    assert main(["slope", *paths, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["shift_impact"]["in_the_snow"]["value"] == pytest.approx(0.2)
    assert main(["slope", *paths, "--scale", "linear"]) == 0
    text = capsys.readouterr().out
    assert "shift impact pp [95% CI over models]" in text and "20.00 [-4.84, 44.84]" in text
    other = _star_result("m3", 0.9, {"in_the_snow": 0.8})
    other["metrics"].pop("imagenet_star")
    with pytest.raises(BenchError, match="no ImageNet\\* metrics"):
        shift_impact_table(results[:1] + [other])
