"""`bench reproduce`: a paper's table from results scored from hand-built predictions, the paper's
numbers beside ours, each with its source; expected tables computed by hand."""

import json

import pytest

from genshift import imagenet
from genshift.cli import main
from genshift.eval.reproduce import reported
from genshift.eval.results import write_result
from tests.resultkit import predictions, scored_result


def _lance(model, orig, rec, cf, *, preprocess="lance-square"):
    """Originals s0..s3 (labels 0..3) and their reconstructions with the given true ranks;
    counterfactuals s0a, s0b (of s0), s1a, s2a; s3 has none, so T = {s0, s1, s2}."""
    src = ["s0", "s1", "s2", "s3"]
    cf_src = ["s0", "s0", "s1", "s2"]
    tables = {
        "original": predictions([0, 1, 2, 3], orig, pair_ids=src, prefix="o"),
        "reconstruction": predictions([0, 1, 2, 3], rec, pair_ids=src, prefix="r"),
        "counterfactual": predictions([int(s[1]) for s in cf_src], cf, pair_ids=cf_src, prefix="c",
                                      edit_types=["background", "domain", "object", "subject"]),
    }
    return scored_result(model, "lance", tables, suite_id="lance-hardimagenet", preprocess=preprocess)


def _save(root, name, result):
    d = root / name
    d.mkdir(parents=True)
    write_result(d / "result.json", result)


def _local(result, arch, digest, declared=None):
    """The record of local weights as ``genshift.identity`` names them (``bench eval --model NAME=FILE``)."""
    result["model"].update(id=f"{arch}@sha256:{digest}", source="checkpoint", tensors_sha256=digest * 4,
                           weights_revision=None, weights_sha256="f" * 64, architecture=arch)
    if declared:
        result["model"]["declared_name"] = declared
    return result


def test_lance_table2_in_the_papers_layout_with_the_subscripts(tmp_path, capsys):
    """Table 2's subscripts are Δacc@k against Original: "Our methods generate progressively more
    challenging test sets as evidenced by the consistent performance drop compared to the original
    test set (Δacc@k, subscript)" (Prabhu et al., Table 2 caption; Eq. 3)."""
    runs = tmp_path / "runs"
    # ResNet-50: T acc@1 2/3 (s0, s1 right; s2 at rank 2), acc@5 3/3; reconstructions of T: s0, s2 right,
    # s1 at rank 3 -> 2/3, 3/3; T': s0a right, s0b rank 5, s1a rank 1, s2a right -> 2/4, 3/4.
    # Eq. 3: Δacc@1 = 2/4 - 2/3 = -16.67, Δacc@5 = 3/4 - 3/3 = -25.00; reconstructed: 0 and 0
    _save(runs, "rn50", _lance("timm/resnet50.a1_in1k", [0, 0, 2, 7], [0, 3, 0, 0], [0, 5, 1, 0]))
    # ViT-B: everything right, but scored with the timm transform (a setting note)
    _save(runs, "vit", _lance("timm/vit_base_patch16_224.augreg_in21k_ft_in1k", [0] * 4, [0] * 4, [0] * 4,
                              preprocess="timm"))
    _save(runs, "r18", _lance("timm/resnet18.a1_in1k", [0] * 4, [0] * 4, [0] * 4))  # not in the population
    assert main(["reproduce", "lance-table2", str(runs)]) == 0
    out = capsys.readouterr().out
    lines = [ln.split() for ln in out.splitlines()]
    # rows: test set / ours / paper / ours - paper; columns ResNet-50, ViT-B, ConvNext (no result: "-")
    assert ["1", "Original", "ours", "66.67", "/", "100.00", "100.00", "/", "100.00", "-", "/", "-"] in lines
    assert ["paper", "79.86", "/", "95.83", "85.42", "/", "97.74", "85.42", "/", "98.26"] in lines
    assert ["ours", "-", "paper", "-13.19", "/", "+4.17", "+14.58", "/", "+2.26", "-", "/", "-"] in lines
    assert ["2", "Reconstructed", "ours", "66.67", "/", "100.00", "100.00", "/", "100.00", "-", "/", "-"] in lines
    assert ["4", "LANCE", "ours", "50.00", "/", "75.00", "100.00", "/", "100.00", "-", "/", "-"] in lines
    assert ["ours", "-", "paper", "-24.01", "/", "-17.96", "+21.00", "/", "+5.76", "-", "/", "-"] in lines
    # the subscripts: ours, the paper's as printed, and the difference
    assert ["Δ", "ours", "-16.67", "/", "-25.00", "+0.00", "/", "+0.00", "-", "/", "-"] in lines
    assert ["Δ", "paper", "-5.8", "/", "-2.9", "-6.4", "/", "-3.5", "-4.2", "/", "-3.6"] in lines
    assert ["Δ", "ours", "-", "Δ", "paper", "-10.87", "/", "-22.10", "+6.40", "/", "+3.50", "-", "/", "-"] in lines
    assert ["Δ", "paper", "+0.0", "/", "+0.4", "+0.0", "/", "-0.2", "-0.2", "/", "-0.2"] in lines
    assert "3 LANCE-R: the random-perturbation baseline (LANCE-R) was not released" in out
    convnext = "ConvNext: bench eval --model convnext_base.fb_in1k --suite lance-hardimagenet --preprocess lance-square"
    assert convnext in out
    assert "timm/resnet18.a1_in1k (resnet18.a1_in1k: not a member's weights)" in out.split("outside the population")[1]
    assert "ViT-B was scored with --preprocess timm; the paper's setting is lance-square" in \
        out.split("notes (what makes a number disagree)")[1]
    filled = out.split("rows filled by:")[1]
    assert f"ResNet-50: Hub weights resnet50.a1_in1k@eeeeeeeeeeee ({runs / 'rn50' / 'result.json'})" in filled
    assert main(["reproduce", "lance-table2", str(runs), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    cell = next(c for c in rep["cells"]
                if c["row"] == "4 LANCE" and c["column"] == "ResNet-50" and c["metric"] == "acc5")
    assert cell["ours"] == pytest.approx(75.0) and cell["paper"] == 92.96 and cell["diff"] == pytest.approx(-17.96)
    assert cell["source"] == {"paper": reported()["lance-table2"]["paper"], "where": "Table 2", "row": "4 LANCE"}
    d = next(c for c in rep["cells"]
             if c["row"] == "4 LANCE" and c["column"] == "ResNet-50" and c["metric"] == "delta_acc1")
    assert d["ours"] == pytest.approx(-100 / 6) and d["paper"] == -5.8 and d["diff"] == pytest.approx(-100 / 6 + 5.8)
    assert d["source"]["row"] == "4 LANCE (subscript)"


def test_reported_subscripts_are_the_papers():
    """Table 2 as printed: "74.01_{-5.8} / 92.96_{-2.9} | 79.00_{-6.4} / 94.24_{-3.5} | 81.18_{-4.2} /
    94.62_{-3.6} | 48.27_{-8.0} / 84.38_{-2.6}" (row 4 LANCE); each subscript is the row minus Original,
    to the printed digit."""
    rows = {r["row"]: r for r in reported()["lance-table2"]["rows"]}
    assert rows["4 LANCE"]["deltas"] == {"ResNet-50": [-5.8, -2.9], "ViT-B": [-6.4, -3.5], "ConvNext": [-4.2, -3.6],
                                         "CLIP": [-8.0, -2.6]}
    for r in ("2 Reconstructed", "3 LANCE-R", "4 LANCE"):
        for col, (d1, d5) in rows[r]["deltas"].items():
            (a1, a5), (o1, o5) = rows[r]["values"][col], rows["1 Original"]["values"][col]
            assert abs((a1 - o1) - d1) <= 0.05 + 1e-9 and abs((a5 - o5) - d5) <= 0.05 + 1e-9, (r, col)


def test_declared_local_weights_fill_their_members_row_marked(tmp_path, capsys):
    """Local weights of a public model fill its row when the result declares its tag (``--model
    resnet50.a1_in1k=ck.pth``), marked with their digest; undeclared local weights never do."""
    runs = tmp_path / "runs"
    _save(runs, "rn50", _local(_lance("x", [0] * 4, [0] * 4, [0] * 4), "resnet50", "0123456789abcdef",
                               declared="resnet50.a1_in1k"))
    _save(runs, "anon", _local(_lance("x", [0] * 4, [0] * 4, [0] * 4), "convnext_base", "fedcba9876543210"))
    assert main(["reproduce", "lance-table2", str(runs)]) == 0
    out = capsys.readouterr().out
    assert "ResNet-50: declared local weights resnet50.a1_in1k (sha256:0123456789abcdef)" in out
    assert "convnext_base@sha256:fedcba9876543210 (local weights, undeclared" in out.split("outside the population")[1]
    assert "ConvNext: bench eval --model convnext_base.fb_in1k" in out


def _in_g(model, suite, failing, *, source="hf-hub", construction=False):
    """10 IN-A-class images, the first ``failing`` with the true class outside the top 3 (rank 4)."""
    labels = imagenet.imagenet_a_indices()[:10]
    t = predictions(labels, [4] * failing + [0] * (10 - failing), prefix=suite)
    return scored_result(model, "in_g", {"generated": t}, suite_id=suite, source=source, construction=construction)


def test_in_g_fig4_transfer_rates_and_the_in21k_range(tmp_path, capsys):
    runs = tmp_path / "runs"
    _save(runs / "rn", "target", _in_g("timm/resnet50.tv_in1k", "in-g-rn", 10, construction=True))
    _save(runs / "rn", "rn2", _local(_in_g("x", "in-g-rn", 8), "resnet50", "0123456789abcdef"))  # own replica weights
    _save(runs / "rn", "bit", _in_g("timm/resnetv2_101x1_bit.goog_in21k_ft_in1k", "in-g-rn", 4))
    _save(runs / "rn", "v16", _in_g("timm/vit_base_patch16_224.augreg_in21k_ft_in1k", "in-g-rn", 5))
    _save(runs / "rn", "v32", _in_g("timm/vit_base_patch32_224.augreg_in21k_ft_in1k", "in-g-rn", 6))
    _save(runs / "vit", "v16", _in_g("timm/vit_base_patch16_224.augreg_in21k_ft_in1k", "in-g-vit", 7))
    assert main(["reproduce", "in-g-fig4", str(runs / "rn"), str(runs / "vit"),
                 "--member", "RN2=resnet50@sha256:0123456789abcdef"]) == 0
    out = capsys.readouterr().out
    rows = {ln.split("  ")[0].strip(): ln for ln in out.splitlines()}
    assert "100.00 (construction model)" in rows["RN"]
    assert rows["RN2"].split()[5:8] == ["80.00", "78", "+2.00"]     # IN-G-RN: ours 80, paper 78
    assert rows["VIT2"].split()[5:8] == ["-", "-", "77"]           # no VIT2 result on either set
    # min/max of 40, 50, 60 vs 39-53; one of three scored on IN-G-ViT
    assert rows["ImageNet-21k models"].split()[-5:] == ["40.00-60.00", "39-53", "+1.00/+7.00", "-", "50-61"]
    assert "RN2 on in-g-rn: your weights for RN2 (sha256:0123456789abcdef)" in out
    assert "VIT2: no public weights; train it, run bench eval --model vit_base_patch16_224=<checkpoint> " \
           "--suite in-g-vit, then bench reproduce ... --member VIT2=<its model id>" in out
    assert "IN-G-ViT: the range needs all 3 ImageNet-21k models; 1 scored" in out
    assert main(["reproduce", "in-g-fig4", str(runs), "--json",
                 "--member", "RN2=resnet50@sha256:0123456789abcdef"]) == 0
    rep = json.loads(capsys.readouterr().out)
    rng = next(c for c in rep["cells"] if c["row"] == "in21k range" and c["column"] == "IN-G-RN")
    assert rng["ours"] == pytest.approx([40.0, 60.0]) and rng["diff"] == pytest.approx([1.0, 7.0])
    assert "39-53%" in rng["source"]["row"]


def test_the_target_scored_from_a_file_fills_the_targets_row_never_the_replicas(tmp_path, capsys):
    """The paper's RN2 is a specific model, "an additional RESNET ... different random seeds": a local
    ResNet-50 is the replica only when named so (--member), never by its architecture."""
    runs = tmp_path / "runs"
    _save(runs, "target", _local(_in_g("x", "in-g-rn", 10, construction=True), "resnet50", "0123456789abcdef",
                                 declared="resnet50.tv_in1k"))
    _save(runs, "other", _local(_in_g("x", "in-g-rn", 3), "resnet50", "1111111111111111"))
    assert main(["reproduce", "in-g-fig4", str(runs)]) == 0
    out = capsys.readouterr().out
    rows = {ln.split("  ")[0].strip(): ln for ln in out.splitlines()}
    assert "100.00 (construction model)" in rows["RN"] and rows["RN2"].split()[5:7] == ["-", "78"]
    assert "RN on in-g-rn: declared local weights resnet50.tv_in1k (sha256:0123456789abcdef)" in out
    assert "resnet50@sha256:1111111111111111 (local weights, undeclared" in out
    assert main(["reproduce", "in-g-fig4", str(runs), "--member", "RN=resnet50@sha256:1111111111111111"]) != 0
    assert "has no member 'RN' without public weights (those are RN2, VIT2" in capsys.readouterr().err


def test_bad_inputs_are_one_line(tmp_path, capsys):
    runs = tmp_path / "runs"
    _save(runs, "a", _lance("timm/resnet50.a1_in1k", [0] * 4, [0] * 4, [0] * 4))
    _save(runs, "b", _local(_lance("x", [0] * 4, [0] * 4, [0] * 4), "resnet50", "0123456789abcdef",
                            declared="resnet50.a1_in1k"))
    assert main(["reproduce", "lance-table2", str(runs)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two results of ResNet-50 (resnet50.a1_in1k) on lance-hardimagenet" in err[0]
    assert main(["reproduce", "lance-table2", str(tmp_path / "nowhere")]) != 0
    assert "no such result file or folder" in capsys.readouterr().err


def _star(model, base_hits, snow_hits):
    labels = list(range(10))
    tables = {c: predictions(labels, [0] * h + [4] * (10 - h), prefix=c)
              for c, h in (("base", base_hits), ("in_the_snow", snow_hits))}
    return scored_result(model, "imagenet_star", tables, suite_id="imagenet-star-upstream")


def test_imagenet_star_slopes_over_the_population(tmp_path, capsys):
    runs = tmp_path / "runs"
    # base 70/80/90 %, snow 30/50/70 %: slope (linear) 2 exactly, R^2 1; impact = mean(40, 30, 20) = 30 pp
    for name, b, s in (("resnet18.tv_in1k", 7, 3), ("resnet50.a1_in1k", 8, 5), ("convnext_tiny.fb_in1k", 9, 7)):
        _save(runs, name, _star("timm/" + name, b, s))
    assert main(["reproduce", "imagenet-star-slopes", str(runs)]) == 0
    out = capsys.readouterr().out
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("in_the_snow"))
    assert row[1:4] == ["30.00", "2.000", "1.000"] and row[-2:] == ["plot", "only"]
    missing = out.split("missing (run these, then reproduce again):")[1]
    assert missing.count("bench eval --model") == 58 and "beit_large_patch16_224.in22k_ft_in22k_in1k" in missing


def test_imagenet_star_slopes_on_imagenet_val_accuracy(tmp_path, capsys):
    """``--id-accuracy``: ImageNet-val top-1 on the x-axis instead of base (the axis is a choice the
    paper's plots do not state); 40/60/80 % vs snow 30/50/70 %: linear slope 1 exactly."""
    runs = tmp_path / "runs"
    for name, b, s in (("resnet18.tv_in1k", 7, 3), ("resnet50.a1_in1k", 8, 5), ("convnext_tiny.fb_in1k", 9, 7)):
        _save(runs, name, _star("timm/" + name, b, s))
    csv = tmp_path / "results-imagenet.csv"
    csv.write_text("model,img_size,top1\nresnet18.tv_in1k,224,40\nresnet50.a1_in1k,224,60\nresnet50.a1_in1k,288,99\n"
                   "convnext_tiny.fb_in1k,224,80\n")
    assert main(["reproduce", "imagenet-star-slopes", str(runs), "--id-accuracy", str(csv)]) == 0
    out = capsys.readouterr().out
    row = next(ln.split() for ln in out.splitlines() if ln.startswith("in_the_snow"))
    assert row[1:4] == ["30.00", "1.000", "1.000"]
    assert f"ID axis: ImageNet-val top-1 from {csv} at each eval's input size" in out
    assert main(["reproduce", "lance-table2", str(runs), "--id-accuracy", str(csv)]) != 0
    assert "--id-accuracy applies to imagenet-star-slopes only" in capsys.readouterr().err
