"""The ID axis from timm's results CSV: normalised ids, the row at the eval's input size, one-line
errors for duplicates and missing rows, and --reference-accuracy results combining in `bench slope`."""

import json

import numpy as np
import pytest

from genshift.cli import main
from genshift.errors import BenchError
from genshift.eval.results import write_result
from genshift.eval.slope import id_accuracy, read_id_table
from genshift.leaderboard import aggregate
from tests.resultkit import predictions, scored_result

# Real rows of timm's results/results-imagenet.csv (huggingface/pytorch-image-models at aa4b5850).
TIMM_ROWS = """model,img_size,top1,top1_err,top5,top5_err,param_count,crop_pct,interpolation
resnet50.a1_in1k,288,81.240,18.760,95.112,4.888,25.56,1.000,bicubic
resnet50.a1_in1k,224,80.382,19.618,94.598,5.402,25.56,0.950,bicubic
resnet50.tv_in1k,224,76.156,23.844,92.866,7.134,25.56,0.875,bilinear
resnet18.a1_in1k,288,73.164,26.836,91.054,8.946,11.69,1.000,bicubic
resnet18.a1_in1k,224,71.504,28.496,90.086,9.914,11.69,0.950,bicubic
convnext_tiny.fb_in22k_ft_in1k,224,82.900,17.100,96.616,3.384,28.59,0.875,bicubic
convnext_tiny.fb_in22k_ft_in1k,288,78.950,21.050,94.708,5.292,28.59,1.000,bicubic
"""


def _star(model, base_hits, snow_hits, *, size, reference_accuracy=None):
    """An ImageNet* result scored from 10 hand-made predictions per config (hits = images right)."""
    labels = list(range(10))
    tables = {c: predictions(labels, [0] * h + [3] * (10 - h), prefix=c)
              for c, h in (("base", base_hits), ("in_the_snow", snow_hits))}
    return scored_result(model, "imagenet_star", tables, suite_id="imagenet-star", input_size=size,
                         reference_accuracy=reference_accuracy)


@pytest.fixture
def csv_file(tmp_path):
    p = tmp_path / "results-imagenet.csv"
    p.write_text(TIMM_ROWS)
    return p


def _write(tmp_path, results):
    paths = []
    for i, r in enumerate(results):
        d = tmp_path / f"run{i}"
        d.mkdir()
        write_result(d / "result.json", r)
        paths.append(str(d / "result.json"))
    return paths


def test_rows_at_the_evals_input_size_for_every_id_form(tmp_path, csv_file, capsys):
    results = [_star("timm/resnet50.a1_in1k", 9, 6, size=288),                   # test size: 288 row
               _star("hf-hub:timm/resnet18.a1_in1k@" + "a" * 40, 8, 4, size=224),  # eval at 224: 224 row
               _star("resnet50.tv_in1k", 9, 5, size=224)]
    paths = _write(tmp_path, results)
    assert main(["slope", *paths, "--id-accuracy", str(csv_file), "--json", "--scale", "linear"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["id_accuracy"] == pytest.approx([0.8124, 0.71504, 0.76156])   # not 80.382, not 73.164
    assert out["id_rows"]["timm/resnet50.a1_in1k"]["img_size"] == 288
    assert out["id_rows"]["timm/resnet18.a1_in1k"]["img_size"] == 224  # results hold canonical ids (genshift.identity)
    # slope by hand: x = (.8124, .71504, .76156), y = (.6, .4, .5); mean x = .76300, mean y = .5
    # Sxy = .0494*.1 + (-.04796)(-.1) + 0 = .009736; Sxx = .0494^2 + .04796^2 + .00144^2 = .0047426
    assert out["shifts"]["in_the_snow"]["linear"]["slope"] == pytest.approx(0.009736 / 0.0047426, rel=1e-3)
    assert "each eval's input size" in out["id_axis"]


def test_board_matching_uses_the_same_normal_form_and_the_evals_size(csv_file, tmp_path):
    table = aggregate.read_id_accuracy(csv_file)
    tv = "hf-hub:timm/resnet50.tv_in1k@" + "b" * 40
    matched, unmatched = aggregate.join_id_accuracy([tv, "timm/x.y", "timm/resnet50.a1_in1k"], table)
    # a model listed at two sizes is not guessed without the size its eval ran at
    assert matched == {tv: pytest.approx(0.76156)} and unmatched == ["timm/x.y", "timm/resnet50.a1_in1k"]
    sizes = {"timm/resnet50.a1_in1k": 288, "timm/resnet18.a1_in1k": 224, tv: 224}
    matched, _ = aggregate.join_id_accuracy(list(sizes), table, sizes)
    assert matched == {"timm/resnet50.a1_in1k": pytest.approx(0.8124), "timm/resnet18.a1_in1k": pytest.approx(0.71504),
                       tv: pytest.approx(0.76156)}
    # the board's sizes come from the results' data_config
    entries = [type("E", (), {"model_id": "timm/resnet50.a1_in1k", "record": _star("timm/resnet50.a1_in1k", 9, 6,
                                                                                     size=288)})()]
    assert aggregate.eval_sizes(entries) == {"timm/resnet50.a1_in1k": 288}
    dup = tmp_path / "dup.csv"
    dup.write_text(TIMM_ROWS + "resnet50.tv_in1k,224,76.0,24,92,8,25.56,0.875,bilinear\n")
    with pytest.raises(BenchError, match="listed twice"):
        aggregate.read_id_accuracy(dup)


def test_a_missing_size_or_model_is_one_line(tmp_path, csv_file, capsys):
    table = read_id_table(csv_file)
    with pytest.raises(BenchError, match=r"resnet50.a1_in1k was evaluated at 256 px but its rows are at 224, 288 px"):
        id_accuracy([_star("timm/resnet50.a1_in1k", 9, 6, size=256)], table)
    paths = _write(tmp_path, [_star("timm/resnet50.a1_in1k", 9, 6, size=288), _star("timm/vit_x.y", 9, 6, size=224)])
    assert main(["slope", *paths, "--id-accuracy", str(csv_file)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "timm/vit_x.y (as 'vit_x.y') has no row" in err[0]


def test_duplicate_rows_are_refused_with_both_lines(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text(TIMM_ROWS + "resnet50.a1_in1k,288,81.000,19.0,95.0,5.0,25.56,1.000,bicubic\n")
    with pytest.raises(BenchError, match=r"dup.csv:9: resnet50.a1_in1k at img_size 288 is listed twice \(also line 2\)"):
        read_id_table(p)
    q = tmp_path / "nosize.csv"
    q.write_text("model,top1\ntimm/resnet50.a1_in1k,80.4\nresnet50.a1_in1k,81.2\n")   # same model in two id forms
    with pytest.raises(BenchError, match=r"listed twice \(also line 2\); .* or add an img_size column"):
        read_id_table(q)


def test_reference_accuracy_results_combine_in_slope(tmp_path, capsys):
    # each model measured against its own ImageNet-val accuracy (bench eval --reference-accuracy A)
    a = _star("timm/resnet50.a1_in1k", 9, 6, size=288, reference_accuracy=0.8124)
    b = _star("timm/resnet18.a1_in1k", 8, 4, size=288, reference_accuracy=0.73164)
    c = _star("timm/resnet50.tv_in1k", 9, 5, size=224, reference_accuracy=0.76156)
    (tmp_path / "ok").mkdir()
    paths = _write(tmp_path / "ok", [a, b, c])
    assert main(["slope", *paths, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # shift impact by hand: drops .8124-.6, .73164-.4, .76156-.5 -> mean (.2124+.33164+.26156)/3 = .26853
    assert out["shift_impact"]["in_the_snow"]["value"] == pytest.approx(np.mean([0.2124, 0.33164, 0.26156]))
    # mixed with a result measured against base: one line
    (tmp_path / "mixed").mkdir()
    paths = _write(tmp_path / "mixed", [a, _star("timm/resnet18.a1_in1k", 8, 4, size=288)])
    assert main(["slope", *paths]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--reference-accuracy" in err[0] and "timm/resnet18.a1_in1k" in err[0]
